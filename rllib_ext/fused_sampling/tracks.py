"""Typed records of the fused single-agent loop: the call's steps for all envs, and one track per env.

A :class:`StepLog` holds one ``sample()`` call's vector steps step-major (index ``s``: what all
``N`` envs returned at step ``s``), so a step costs a few list appends whatever ``N`` is. A
:class:`Track` is one env's episode chunk in progress: its *head* (the items before the call's
first step: the previous chunk's last steps kept as lookback, as
``SingleAgentEpisode.cut(len_lookback_buffer=...)`` keeps them, and the first observation) and
the range of log steps it took since. Every running env takes each vector step, so a chunk's
steps are one contiguous range of the log; with gymnasium's next-step autoreset an env whose
episode ended returns its reset observation at the next step, which starts its next track.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tree
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO as WEIGHTS

__all__ = ["StepLog", "Track"]


@dataclass
class StepLog:
    """One call's vector steps: per step the envs' ``obs`` ``[N, ...]`` (after the step),
    ``infos`` (``N`` dicts), ``actions`` ``[N, ...]`` (as episodes store them), ``rewards``
    ``[N]``, ``extra`` (column -> ``[N, ...]`` or a nested dict of those: the module's outputs
    and ``action_logp``),
    the ``weights_seq_no`` the actions were computed with, ``times`` (``perf_counter``) and
    ``timing`` (the policy step's seconds on the env-to-module / module-to-env work)."""

    obs: list[Any] = field(default_factory=list)
    infos: list[Any] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    rewards: list[Any] = field(default_factory=list)
    extra: list[dict[str, Any]] = field(default_factory=list)
    weights_seq_no: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    timing: list[tuple[float, float]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.obs)


@dataclass
class Track:
    """See the module docstring. ``head_obs``/``head_infos`` hold ``lookback + 1`` entries
    (empty: a new episode whose reset observation has not arrived, RLlib's
    ``not episode.is_reset``); ``head_actions``/``head_rewards``/``head_extra`` ``lookback``.
    The chunk's own steps are log steps ``first`` to ``end`` (``None``: up to the log's end)."""

    episode_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    t_started: int = 0
    lookback: int = 0
    head_obs: list[Any] = field(default_factory=list)
    head_infos: list[Any] = field(default_factory=list)
    head_actions: list[Any] = field(default_factory=list)
    head_rewards: list[Any] = field(default_factory=list)
    head_extra: dict[str, list[Any]] = field(default_factory=dict)
    first: int = 0
    end: int | None = None
    start_time: float | None = None
    """``perf_counter`` at the reset; ``None`` for a continued chunk (its clock starts at its
    first step, as after RLlib's ``cut()``)."""

    @property
    def is_reset(self) -> bool:
        return bool(self.head_obs)

    def reset(self, observation: Any, info: Any, *, first: int, time: float) -> None:
        """``add_env_reset``: the episode's first observation; its steps start at log step
        ``first``."""
        self.head_obs, self.head_infos = [observation], [info]
        self.first, self.start_time = first, time

    def steps(self, log: StepLog) -> int:
        """Env steps of this chunk (lookback excluded)."""
        return (len(log) if self.end is None else self.end) - self.first

    def items(self, log: StepLog, env: int) -> dict[str, Any]:
        """The chunk as the per-step lists ``SingleAgentEpisode``'s constructor takes
        (``observations``, ``infos``, ``actions``, ``rewards``, ``extra_model_outputs``), the
        head first, then env ``env``'s rows of the chunk's log steps."""
        steps = range(self.first, len(log) if self.end is None else self.end)
        columns = log.extra[steps[0]].keys() if steps else self.head_extra.keys() - {WEIGHTS}
        extra = {
            key: self.head_extra.get(key, []) + [_row(log.extra[s][key], env) for s in steps]
            for key in columns
        }
        if steps or WEIGHTS in self.head_extra:
            extra[WEIGHTS] = self.head_extra.get(WEIGHTS, []) + [
                log.weights_seq_no[s] for s in steps
            ]
        return dict(
            observations=self.head_obs + [log.obs[s][env] for s in steps],
            infos=self.head_infos + [log.infos[s][env] for s in steps],
            actions=self.head_actions + [log.actions[s][env] for s in steps],
            rewards=self.head_rewards + [log.rewards[s][env] for s in steps],
            extra_model_outputs=extra,
        )

    def clock(self, log: StepLog) -> tuple[float | None, float | None]:
        """``(start_time, last_step_time)`` of the chunk (``None`` where it has no step)."""
        steps = self.steps(log)
        if not steps:
            return self.start_time, None
        start = self.start_time if self.start_time is not None else log.times[self.first]
        return start, log.times[self.first + steps - 1]

    def continuation(self, items: dict[str, Any], steps: int, lookback: int) -> Track:
        """The next chunk of this running episode, like ``cut(len_lookback_buffer=lookback)``:
        it starts at this chunk's last observation, with up to ``lookback`` steps before it,
        this chunk's own lookback included (as RLlib's ``cut`` reaches into it); its own steps
        start at the next log. ``items``: this chunk's :meth:`items`."""
        keep = min(lookback, len(items["actions"]))
        rest = slice(len(items["actions"]) - keep, None)
        return Track(
            episode_id=self.episode_id,
            t_started=self.t_started + steps,
            lookback=keep,
            head_obs=items["observations"][-keep - 1 :],
            head_infos=items["infos"][-keep - 1 :],
            head_actions=items["actions"][rest],
            head_rewards=items["rewards"][rest],
            head_extra={key: values[rest] for key, values in items["extra_model_outputs"].items()},
        )


def _row(value: Any, env: int) -> Any:
    """Env ``env``'s row of a batched column (an array, or a nested dict of arrays, as RLlib's
    ``UnBatchToIndividualItems`` splits it)."""
    if isinstance(value, np.ndarray):
        return value[env]
    return tree.map_structure(lambda leaf: leaf[env], value)
