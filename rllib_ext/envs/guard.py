"""Env guard: a crashing env costs only its episode in flight; non-finite data is reported.

Why RLlib 2.58 alone stalls when an env raises in ``step()`` (found by reading its code):

* ``restart_failed_env_runners=True`` (RLlib's default): ``FaultAwareApply.apply`` turns any
  exception raised inside ``EnvRunner.sample()`` into ``sleep(delay_between_env_runner_restarts_s)``
  (60 s) and ``sys.exit(1)`` (ray-project/ray#62884). The sleep equals ``sample_timeout_s`` (60 s),
  so the driver drops the runner's whole ``sample()`` call; the iteration trains on nothing
  (``nan`` losses), and the restarted actor fails again, because the unit of loss is one whole
  ``sample()`` call: at 1 % per step, ``0.99 ** rollout_fragment_length`` (1.8 % for 400 steps,
  ~2e-9 for 2000) of the calls ever return.
* ``restart_failed_sub_environments=True``: ``SingleAgentEnvRunner._sample`` re-creates the whole
  vector env and sets its step counter back to 0 (``ts = 0``, "discarding all collected episodes
  thus far for simplicity", ray-project/ray#47608), so a call returns only after
  ``rollout_fragment_length`` failure-free vector steps in a row: the same odds.

:class:`GuardedEnv` isolates the fault where it happens, one sub-env: ``step()`` errors end that
sub-env's episode (truncated, flagged in ``info``) and re-create that sub-env only; the other
sub-envs, the runner and the sample call go on. :class:`EnvGuardCallback` drops the flagged
episode chunks in ``on_sample_end``, so the learner never sees the fake last step. Non-finite
rewards or float observations are logged (env, runner, episode, step) and, with
``non_finite="drop"``, the episode is ended and dropped the same way.

:func:`guard_env` applies both to a single-agent config by registering the guarded creator
under the env's own name with ``ray.tune.register_env`` (RLlib's first lookup), so the name
in configs, checkpoints and results is unchanged. Multi-agent envs are left as RLlib runs them.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.utils.annotations import override
from ray.tune.registry import register_env

from rllib_ext import _rllib_private as private
from rllib_ext.callbacks import add_callback
from rllib_ext.envs import is_smac_env

__all__ = [
    "ENV_ERROR_KEY",
    "NON_FINITE_KEY",
    "NON_FINITE_MODES",
    "EnvGuardCallback",
    "GuardedCreator",
    "GuardedEnv",
    "base_env_creator",
    "guard_env",
]

logger = logging.getLogger(__name__)

ENV_ERROR_KEY = "rllib_ext/env_error"
"""``info`` key on the last step of an episode ended by an env exception (the error text)."""
NON_FINITE_KEY = "rllib_ext/non_finite"
"""``info`` key on the last step of an episode ended (``non_finite="drop"``) by nan/inf data."""
NON_FINITE_MODES = ("warn", "drop")
MAX_RESET_ATTEMPTS = 3
"""A sub-env whose re-created copies fail ``reset()`` this many times in a row fails the run."""

# Metric keys (under env_runners/): lifetime counts.
ENV_RESTARTS = "rllib_ext/env_restarts"
DROPPED_EPISODES = "rllib_ext/episodes_dropped"
NON_FINITE_EPISODES = "rllib_ext/non_finite_episodes"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _non_finite(value: Any) -> bool:
    """True if any float leaf of ``value`` (array, scalar, dict/tuple of them) is nan or inf."""
    if isinstance(value, Mapping):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return any(_non_finite(v) for v in value)
    array = np.asarray(value)
    return array.dtype.kind in "fc" and not bool(np.isfinite(array).all())


class GuardedEnv(gym.Wrapper):
    """One (sub-)env with its faults contained.

    Args:
        make: builds a fresh copy of the wrapped env (called again after a failure).
        name: the env's name, for messages.
        worker_index: the env runner's index (0: the driver's), for messages.
        isolate_faults: catch ``step()``/``reset()`` exceptions (else they propagate).
        non_finite: ``"warn"`` logs nan/inf rewards or observations; ``"drop"`` also ends the
            episode there and flags it for :class:`EnvGuardCallback` to drop.
    """

    def __init__(
        self,
        make: Callable[[], gym.Env],
        *,
        name: str,
        worker_index: int = 0,
        isolate_faults: bool = True,
        non_finite: str = "warn",
    ) -> None:
        if non_finite not in NON_FINITE_MODES:
            raise ValueError(
                f"non_finite={non_finite!r} is not supported; allowed values: "
                f"{', '.join(NON_FINITE_MODES)}. Fix: non_finite='warn'."
            )
        super().__init__(make())
        self._make = make
        self._name = name
        self._worker_index = worker_index
        self._isolate_faults = isolate_faults
        self._non_finite = non_finite
        self._episode = 0
        self._step = 0
        self._last_obs: Any = None
        self._warned_episode = -1
        self.restarts = 0
        """Times this env copy was re-created after an exception."""

    def _where(self) -> str:
        return (
            f"env {self._name!r} (env runner {self._worker_index}), episode {self._episode} "
            f"of this env copy, step {self._step}"
        )

    def _recreate(self) -> None:
        try:
            self.env.close()
        except Exception:  # noqa: BLE001 - the broken copy may not close cleanly
            logger.debug("closing the failed env copy raised", exc_info=True)
        self.env = self._make()
        self.restarts += 1

    @override(gym.Wrapper)
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        for attempt in range(1, MAX_RESET_ATTEMPTS + 1):
            try:
                obs, info = self.env.reset(seed=seed, options=options)
                break
            except Exception as exc:
                if not self._isolate_faults or attempt == MAX_RESET_ATTEMPTS:
                    raise
                logger.warning(
                    "%s: reset() raised %s; re-creating this env copy (attempt %d of %d)",
                    self._where(),
                    _first_line(exc),
                    attempt,
                    MAX_RESET_ATTEMPTS,
                )
                self._recreate()
        self._episode += 1
        self._step = 0
        self._last_obs = obs
        if _non_finite(obs):
            self._warn_non_finite("observation from reset()")
        return obs, info

    @override(gym.Wrapper)
    def step(self, action: Any) -> Any:
        self._step += 1
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
        except Exception as exc:
            if not self._isolate_faults:
                raise
            error = _first_line(exc)
            logger.warning(
                "%s: step() raised %s; this episode is dropped and the env copy re-created "
                "(the env runner keeps sampling)",
                self._where(),
                error,
            )
            self._recreate()
            # The episode ends here (truncated) on its last good observation; the flag makes
            # EnvGuardCallback drop the chunk, so the fake last step is never trained on.
            return self._last_obs, 0.0, False, True, {ENV_ERROR_KEY: error}
        bad = [
            what for what, value in (("reward", reward), ("observation", obs)) if _non_finite(value)
        ]
        if bad:
            self._warn_non_finite(" and ".join(bad))
            if self._non_finite == "drop":
                info = {**info, NON_FINITE_KEY: " and ".join(bad)}
                return self._last_obs, 0.0, False, True, info
        self._last_obs = obs
        return obs, reward, terminated, truncated, info

    def _warn_non_finite(self, what: str) -> None:
        if self._warned_episode == self._episode:
            return  # one line per episode
        self._warned_episode = self._episode
        action = (
            "the episode is dropped"
            if self._non_finite == "drop"
            else "training on it gives nan losses; --non-finite drop drops such episodes"
        )
        logger.warning("%s: non-finite (nan/inf) %s; %s", self._where(), what, action)


def base_env_creator(env: str) -> Callable[[Any], Any]:
    """The creator RLlib would use for ``env``: a Ray-registered name, ``module:EnvId-v0``
    or a gymnasium id (``gym.make``), or a ``pkg.module.Class`` path (``Class(env_config)``).
    """
    creator = private.registered_env_creator(env)
    if creator is not None:
        return creator.base if isinstance(creator, GuardedCreator) else creator
    if ":" not in env and "." in env:
        module_name, _, attr = env.rpartition(".")
        cls = getattr(importlib.import_module(module_name), attr)
        return lambda env_config: cls(env_config)
    return lambda env_config: gym.make(env, **dict(env_config))


@dataclass
class GuardedCreator:
    """Picklable env creator (what :func:`guard_env` registers): builds the env, wraps it."""

    env: str
    base: Callable[[Any], Any]
    isolate_faults: bool = True
    non_finite: str = "warn"

    def __call__(self, env_config: Any) -> Any:
        first = self.base(env_config)
        if isinstance(first, MultiAgentEnv) or not isinstance(first, gym.Env):
            return first
        made = [first]

        def make() -> gym.Env:
            return made.pop() if made else self.base(env_config)

        return GuardedEnv(
            make,
            name=self.env,
            worker_index=int(getattr(env_config, "worker_index", 0) or 0),
            isolate_faults=self.isolate_faults,
            non_finite=self.non_finite,
        )


class EnvGuardCallback(RLlibCallback):
    """Drops episode chunks that :class:`GuardedEnv` flagged; counts them and env restarts.

    Results: ``env_runners/rllib_ext/episodes_dropped``, ``.../non_finite_episodes`` and
    ``.../env_restarts`` (lifetime counts).
    """

    def __init__(self) -> None:
        super().__init__()
        self._restarts_reported = 0

    @override(RLlibCallback)
    def on_sample_end(
        self,
        *,
        env_runner: Any = None,
        metrics_logger: Any = None,
        samples: Any = None,
        **kwargs: Any,
    ) -> None:
        if samples is None:
            return
        kept, dropped, non_finite = [], 0, 0
        for episode in samples:
            info = episode.get_infos(-1) if len(episode) > 0 else {}
            if isinstance(info, Mapping) and (ENV_ERROR_KEY in info or NON_FINITE_KEY in info):
                dropped += 1
                non_finite += NON_FINITE_KEY in info
                continue
            kept.append(episode)
        # RLlib returns this very list from sample(): dropping here keeps the chunks out of
        # the train batch.
        samples[:] = kept
        if metrics_logger is None:
            return
        total = _restarts(env_runner)
        restarts = max(0, total - self._restarts_reported)  # RLlib's make_env() starts over
        self._restarts_reported = total
        metrics_logger.log_value(DROPPED_EPISODES, dropped, reduce="lifetime_sum")
        metrics_logger.log_value(NON_FINITE_EPISODES, non_finite, reduce="lifetime_sum")
        metrics_logger.log_value(ENV_RESTARTS, restarts, reduce="lifetime_sum")


def _restarts(env_runner: Any) -> int:
    """Sum of :attr:`GuardedEnv.restarts` over the env runner's sub-envs."""
    vector = getattr(env_runner, "env", None)
    total = 0
    for env in getattr(getattr(vector, "unwrapped", vector), "envs", ()):
        try:
            total += int(env.get_wrapper_attr("restarts"))
        except AttributeError:
            continue
    return total


def guard_env(config: Any, *, isolate_faults: bool = True, non_finite: str = "warn") -> Any:
    """Applies the guard to ``config`` (single-agent envs given by name); returns ``config``.

    Registers :class:`GuardedCreator` under ``config.env`` with ``ray.tune.register_env`` (call
    before ``ray.init`` or with Ray running: the registry reaches the env runners either way)
    and adds :class:`EnvGuardCallback`. Multi-agent configs and non-string envs are returned
    unchanged.
    """
    if non_finite not in NON_FINITE_MODES:
        raise ValueError(
            f"non_finite={non_finite!r} is not supported; allowed values: "
            f"{', '.join(NON_FINITE_MODES)}. Fix: non_finite='warn'."
        )
    if not isinstance(config.env, str) or config.is_multi_agent:
        return config
    if is_smac_env(config.env):
        return config
    register_env(
        config.env,
        GuardedCreator(
            env=config.env,
            base=base_env_creator(config.env),
            isolate_faults=isolate_faults,
            non_finite=non_finite,
        ),
    )
    add_callback(config, EnvGuardCallback)
    return config
