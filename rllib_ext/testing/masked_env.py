"""Conformance checks for RLlib multi-agent envs with action masks (use them on your own env).

:func:`check_masked_multiagent_env` runs RLlib's own env checker, then a random rollout that
samples only legal actions and checks the contract :class:`rllib_ext.envs.smac.SMACEnv`
documents: ``Dict`` observations with a 0/1 ``"action_mask"`` that always allows at least one
action, observations inside their spaces, ``"__all__"`` in both done dicts, never terminated
and truncated at once, and a ``ValueError`` (not a crash or a silent step) for a masked action.

:class:`BackendSpy` sits between a ``SMACEnv`` and its backend and fails loudly if an
illegal action ever reaches the game, independently of the wrapper's own check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from ray.rllib.utils.pre_checks.env import check_multiagent_environments

__all__ = ["BackendSpy", "MaskedEnvReport", "check_masked_multiagent_env", "sample_legal"]


@dataclass
class MaskedEnvReport:
    """What a :func:`check_masked_multiagent_env` rollout saw."""

    steps: int = 0
    episodes: int = 0
    terminated: int = 0
    truncated: int = 0
    illegal_action_rejected: bool = False


def _fail(message: str) -> NoReturn:
    raise AssertionError(message)


def sample_legal(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform random legal actions: ``mask`` is ``[..., A]`` in {0, 1}; returns ``int [...]``."""
    return np.argmax(rng.random(mask.shape) * (np.asarray(mask) > 0), axis=-1)


def _check_obs(env: Any, obs: dict[str, Any], where: str) -> None:
    for agent, agent_obs in obs.items():
        space = env.get_observation_space(agent)
        if not isinstance(agent_obs, dict) or "action_mask" not in agent_obs:
            _fail(
                f"{where}: obs[{agent!r}] must be a dict with an 'action_mask' entry, got "
                f"{type(agent_obs).__name__}. Fix: return Dict observations."
            )
        if not space.contains(agent_obs):
            _fail(
                f"{where}: obs[{agent!r}] is outside its observation space {space}. "
                "Fix: match dtypes (float32) and shapes of the space."
            )
        mask = np.asarray(agent_obs["action_mask"])
        if not np.isin(mask, (0, 1)).all() or mask.sum() < 1:
            _fail(
                f"{where}: action_mask of {agent!r} must be 0/1 with at least one legal "
                f"action, got {mask.tolist()}. Fix: keep a no-op legal (e.g. for dead agents)."
            )


def check_masked_multiagent_env(
    env: Any, *, num_steps: int = 500, seed: int = 0
) -> MaskedEnvReport:
    """Checks ``env`` (an RLlib ``MultiAgentEnv``) as described in the module docstring.

    Raises:
        AssertionError: with what is wrong and how to fix it.
    """
    check_multiagent_environments(env)
    rng = np.random.default_rng(seed)
    report = MaskedEnvReport()
    obs, infos = env.reset(seed=seed)
    _check_obs(env, obs, "reset()")
    while report.steps < num_steps:
        actions = {
            agent: int(sample_legal(agent_obs["action_mask"], rng))
            for agent, agent_obs in obs.items()
        }
        if not report.illegal_action_rejected:
            for agent, agent_obs in obs.items():
                masked = np.flatnonzero(np.asarray(agent_obs["action_mask"]) == 0)
                if masked.size:
                    try:
                        env.step({**actions, agent: int(masked[0])})
                    except ValueError:
                        report.illegal_action_rejected = True
                        break
                    _fail(
                        f"step() accepted the masked action {int(masked[0])} of {agent!r}. "
                        "Fix: raise a ValueError naming the legal actions."
                    )
        obs, rewards, terminateds, truncateds, infos = env.step(actions)
        report.steps += 1
        _check_obs(env, obs, f"step {report.steps}")
        if "__all__" not in terminateds or "__all__" not in truncateds:
            _fail("terminateds and truncateds must both carry '__all__' (RLlib reads it).")
        for agent in terminateds:
            if terminateds[agent] and truncateds.get(agent, False):
                _fail(
                    f"{agent!r} is terminated and truncated at once. Fix: the time limit is "
                    "truncated only, a decided episode terminated only."
                )
        if terminateds["__all__"] or truncateds["__all__"]:
            report.episodes += 1
            report.terminated += bool(terminateds["__all__"])
            report.truncated += bool(truncateds["__all__"])
            obs, infos = env.reset()
            _check_obs(env, obs, "reset()")
    return report


class BackendSpy:
    """Wraps ``SMACEnv.backend``; raises if an action the game marked illegal reaches it.

    Use ``spy = BackendSpy.install(env)``; afterwards ``spy.steps`` counts backend steps and
    ``spy.actions`` (a list of ``int [N]`` arrays) records what reached the game.
    """

    def __init__(self, backend: Any, *, record: bool = True) -> None:
        self._backend = backend
        self._avail: np.ndarray | None = None
        self._record = record
        self.spec = backend.spec
        self.steps = 0
        self.actions: list[np.ndarray] = []

    @classmethod
    def install(cls, env: Any, *, record: bool = True) -> BackendSpy:
        spy = cls(env.backend, record=record)
        env.backend = spy
        return spy

    @property
    def restarts(self) -> int:
        return self._backend.restarts

    def reset(self, seed: int | None) -> Any:
        out = self._backend.reset(seed)
        self._avail = np.array(out.avail, copy=True)
        return out

    def step(self, actions: np.ndarray) -> Any:
        if self._avail is None:
            _fail("step() reached the backend before any reset().")
        actions = np.asarray(actions)
        legal = self._avail[np.arange(len(actions)), actions] > 0
        if not legal.all():
            i = int(np.flatnonzero(~legal)[0])
            _fail(
                f"Illegal action {int(actions[i])} of agent {i} reached the backend; legal: "
                f"{np.flatnonzero(self._avail[i]).tolist()}."
            )
        self.steps += 1
        if self._record:
            self.actions.append(actions.copy())
        out = self._backend.step(actions)
        self._avail = np.array(out.avail, copy=True)
        return out

    def close(self) -> None:
        self._backend.close()
