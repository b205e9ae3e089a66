"""``rllib-ext evaluate CHECKPOINT``: greedy episodes with a trained policy, no Ray needed.

The checkpoint's own config rebuilds a *local* EnvRunner (the same class RLlib samples with),
restores its connectors (observation filters and the like) and the learner's RLModule weights,
and samples with ``explore=False``: ``forward_inference`` plus ``dist.to_deterministic()``
(argmax for discrete actions, the mean for Gaussian ones) in RLlib's ``GetActions`` connector.

Single-agent and multi-agent checkpoints differ only in the EnvRunner class and the path of
the module weights, see :data:`_EPISODE_RUNNERS`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rllib_ext.cli.runconfig import CLIError, resolve_checkpoint

__all__ = ["EvaluationResult", "evaluate", "load_checkpoint_config"]


@dataclass(frozen=True)
class EvaluationResult:
    checkpoint: Path
    env: str
    returns: tuple[float, ...]
    wins: tuple[bool, ...] = ()
    """SMAC envs: ``battle_won`` of each episode (empty for envs without battles)."""

    @property
    def win_rate(self) -> float | None:
        return float(np.mean(self.wins)) if self.wins else None

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


def load_checkpoint_config(checkpoint: Path) -> Any:
    """The ``AlgorithmConfig`` an RLlib algorithm checkpoint was written with."""
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    ctor_file = checkpoint / "class_and_ctor_args.pkl"
    try:
        with ctor_file.open("rb") as f:
            ctor = pickle.load(f)
        config_state = ctor["ctor_args_and_kwargs"][0][0]
        return AlgorithmConfig.from_state(config_state)
    except (OSError, KeyError, IndexError, TypeError, pickle.UnpicklingError) as exc:
        raise CLIError(
            f"checkpoint {str(checkpoint)!r} has no readable algorithm config ({exc}). Fix: pass "
            "an algorithm checkpoint written by 'rllib-ext train' or Algorithm.save_to_path()."
        ) from None


Episodes = list[Any]


def _run_single_agent(config: Any, checkpoint: Path, episodes: int) -> Episodes:
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    runner = SingleAgentEnvRunner(config=config)
    try:
        runner.restore_from_path(checkpoint / "env_runner")
        # The EnvRunner holds one RLModule; the learner's copy of the policy is the trained one.
        module_dir = checkpoint / "learner_group" / "learner" / "rl_module" / "default_policy"
        runner.restore_from_path(module_dir, component="rl_module")
        return runner.sample(num_episodes=episodes, explore=False)[:episodes]
    finally:
        runner.stop()


def _run_multi_agent(config: Any, checkpoint: Path, episodes: int) -> Episodes:
    """Multi-agent checkpoints (SMAC, PettingZoo): episode returns are summed over agents."""
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    runner = MultiAgentEnvRunner(config=config)
    try:
        runner.restore_from_path(checkpoint / "env_runner")
        module_dir = checkpoint / "learner_group" / "learner" / "rl_module"
        runner.restore_from_path(module_dir, component="rl_module")
        return runner.sample(num_episodes=episodes, explore=False)[:episodes]
    finally:
        runner.stop()


_EPISODE_RUNNERS: dict[bool, Callable[[Any, Path, int], Episodes]] = {
    False: _run_single_agent,
    True: _run_multi_agent,
}
"""``config.is_multi_agent`` -> how to play episodes."""


def evaluate(
    checkpoint: str | Path,
    *,
    episodes: int = 10,
    env: str | None = None,
    env_config: dict[str, Any] | None = None,
    seed: int | None = None,
) -> EvaluationResult:
    """Plays ``episodes`` greedy episodes with the policy in ``checkpoint``.

    Args:
        checkpoint: an algorithm checkpoint or a ``rllib-ext train`` run directory.
        env, env_config: override the checkpoint's env (default: the one it trained on).
        seed: env seed (default: the checkpoint's).

    Raises:
        CLIError: no checkpoint at the path, bad env override, or ``episodes < 1``.
    """
    if episodes < 1:
        raise CLIError(f"--episodes {episodes} must be >= 1. Fix: e.g. --episodes 10.")
    path = resolve_checkpoint(checkpoint, flag="evaluate")
    config = load_checkpoint_config(path).copy(copy_frozen=False)
    if env is not None or env_config is not None:
        from rllib_ext.cli.envs import check_env

        env = env or config.env
        env_config = dict(env_config if env_config is not None else config.env_config)
        if not config.is_multi_agent:
            check_env(env, env_config)
        config.environment(env, env_config=env_config)
    # One env copy: exactly `episodes` episodes, and the same env seed sequence every call.
    config.env_runners(num_env_runners=0, num_envs_per_env_runner=1, explore=False)
    if seed is not None:
        config.debugging(seed=seed)
    from rllib_ext.envs.smac import battle_info

    played = _EPISODE_RUNNERS[bool(config.is_multi_agent)](config, path, episodes)
    infos = [battle_info(e) for e in played]
    wins = tuple(bool(i["battle_won"]) for i in infos if i is not None)
    return EvaluationResult(
        checkpoint=path,
        env=str(config.env),
        returns=tuple(float(e.get_return()) for e in played),
        wins=wins if len(wins) == len(played) else (),
    )
