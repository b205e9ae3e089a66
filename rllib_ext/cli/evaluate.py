"""``rllib-ext evaluate CHECKPOINT``: episodes with a trained policy, no Ray needed.

The checkpoint's own config rebuilds a *local* EnvRunner (the same class RLlib samples with),
restores its connectors (observation filters and the like) and the learner's RLModule weights,
and samples with ``explore=False``: ``forward_inference`` plus ``dist.to_deterministic()``
(argmax for discrete actions, the mean for Gaussian ones) in RLlib's ``GetActions`` connector;
``explore=True`` (``--explore``) samples from the action distribution instead
(``forward_exploration``), as the training runs did.

``video_dir`` (``--video DIR``) wraps a gymnasium env in gymnasium's ``RecordVideo``
(``render_mode="rgb_array"``, one MP4 per episode; needs ``moviepy``, the ``video`` extra).

Single-agent and multi-agent checkpoints differ only in the EnvRunner class and the path of
the module weights, see :data:`_EPISODE_RUNNERS`.
"""

from __future__ import annotations

import functools
import importlib.util
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
    explore: bool = False
    video_dir: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` output."""
        return {
            "checkpoint": str(self.checkpoint),
            "env": self.env,
            "episodes": len(self.returns),
            "policy": "stochastic" if self.explore else "greedy",
            "mean_return": self.mean,
            "std_return": self.std,
            "returns": list(self.returns),
            "win_rate": self.win_rate,
            "wins": list(self.wins) if self.wins else None,
            "video_dir": str(self.video_dir) if self.video_dir else None,
        }

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


def _run_single_agent(config: Any, checkpoint: Path, episodes: int, explore: bool) -> Episodes:
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    runner = SingleAgentEnvRunner(config=config)
    try:
        runner.restore_from_path(checkpoint / "env_runner")
        # The EnvRunner holds one RLModule; the learner's copy of the policy is the trained one.
        module_dir = checkpoint / "learner_group" / "learner" / "rl_module" / "default_policy"
        runner.restore_from_path(module_dir, component="rl_module")
        return runner.sample(num_episodes=episodes, explore=explore)[:episodes]
    finally:
        runner.stop()


def _run_multi_agent(config: Any, checkpoint: Path, episodes: int, explore: bool) -> Episodes:
    """Multi-agent checkpoints (SMAC, PettingZoo): episode returns are summed over agents."""
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    runner = MultiAgentEnvRunner(config=config)
    try:
        runner.restore_from_path(checkpoint / "env_runner")
        module_dir = checkpoint / "learner_group" / "learner" / "rl_module"
        runner.restore_from_path(module_dir, component="rl_module")
        return runner.sample(num_episodes=episodes, explore=explore)[:episodes]
    finally:
        runner.stop()


_EPISODE_RUNNERS: dict[bool, Callable[[Any, Path, int, bool], Episodes]] = {
    False: _run_single_agent,
    True: _run_multi_agent,
}
"""``config.is_multi_agent`` -> how to play episodes."""


def _recording_env(
    env_id: str, env_config: dict[str, Any], video_dir: str, env_context: Any = None
) -> Any:
    """``env_id`` rendering to ``rgb_array``, one video per episode in ``video_dir``."""
    import gymnasium as gym
    from gymnasium.wrappers import RecordVideo

    env = gym.make(env_id, render_mode="rgb_array", **env_config)
    return RecordVideo(env, video_folder=video_dir, episode_trigger=lambda _: True)


def _record_videos(config: Any, video_dir: Path) -> None:
    """Points ``config`` at a recording copy of its gymnasium env.

    Raises:
        CLIError: moviepy missing, a multi-agent checkpoint, or an env that is no gymnasium id.
    """
    import gymnasium as gym

    if importlib.util.find_spec("moviepy") is None:
        raise CLIError(
            "--video needs moviepy (gymnasium's RecordVideo writes MP4s with it). Fix: "
            'pip install "rllib-ext[video]", or drop --video.'
        )
    env = config.env
    if config.is_multi_agent or not isinstance(env, str) or env not in gym.registry:
        raise CLIError(
            f"--video records gymnasium envs (an id such as CartPole-v1), not {env!r}. Fix: drop "
            "--video, or pass --env with a gymnasium id that renders rgb_array frames."
        )
    video_dir.mkdir(parents=True, exist_ok=True)
    config.environment(
        env=functools.partial(
            _recording_env, env, dict(config.env_config or {}), str(video_dir.resolve())
        ),
        env_config={},
    )


def evaluate(
    checkpoint: str | Path,
    *,
    episodes: int = 10,
    env: str | None = None,
    env_config: dict[str, Any] | None = None,
    seed: int | None = None,
    explore: bool = False,
    video_dir: str | Path | None = None,
) -> EvaluationResult:
    """Plays ``episodes`` episodes with the policy in ``checkpoint`` (greedy by default).

    Args:
        checkpoint: an algorithm checkpoint or a ``rllib-ext train`` run directory.
        env, env_config: override the checkpoint's env (default: the one it trained on).
        seed: env seed (default: the checkpoint's).
        explore: sample actions from the policy's distribution instead of the greedy action.
        video_dir: record one video per episode there (gymnasium envs, needs ``moviepy``).

    Raises:
        CLIError: no checkpoint at the path, bad env override, ``episodes < 1``, or a
            ``video_dir`` that cannot be recorded (see :func:`_record_videos`).
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
    config.env_runners(num_env_runners=0, num_envs_per_env_runner=1, explore=explore)
    if seed is not None:
        config.debugging(seed=seed)
    env_name = str(config.env)
    if video_dir is not None:
        video_dir = Path(video_dir)
        _record_videos(config, video_dir)
    from rllib_ext.envs.smac import battle_info

    played = _EPISODE_RUNNERS[bool(config.is_multi_agent)](config, path, episodes, explore)
    infos = [battle_info(e) for e in played]
    wins = tuple(bool(i["battle_won"]) for i in infos if i is not None)
    return EvaluationResult(
        checkpoint=path,
        env=env_name,
        returns=tuple(float(e.get_return()) for e in played),
        wins=wins if len(wins) == len(played) else (),
        explore=explore,
        video_dir=video_dir,
    )
