"""``rllib-ext evaluate CHECKPOINT``: episodes with a trained policy, no Ray needed.

Everything is loaded through RLlib's public checkpoint API, in one local process:

* the config: the one ``rllib-ext train`` built from the settings saved in the checkpoint
  (:func:`~rllib_ext.cli.runconfig.saved_settings`), or, for RLlib's own algorithm
  checkpoints, the config of the env runner that RLlib's reader
  ``Checkpointable.from_checkpoint(CHECKPOINT/env_runner)`` rebuilds;
* the env runner's state (connectors: observation filters and the like) with
  ``EnvRunner.restore_from_path``;
* the trained weights with ``RLModule.from_checkpoint`` on the learner's module
  (``learner_group/learner/rl_module``, RLlib's ``COMPONENT_*`` names), handed to the env
  runner with ``set_state`` like a weight sync during training.

A *local* EnvRunner (the same class RLlib samples with) then plays with ``explore=False``:
``forward_inference`` plus ``dist.to_deterministic()`` (argmax for discrete actions, the mean
for Gaussian ones) in RLlib's ``GetActions`` connector; ``explore=True`` (``--explore``)
samples from the action distribution instead (``forward_exploration``), as the training runs
did.

SMAC checkpoints on the SMAX backend play their battles batched instead
(:func:`rllib_ext.envs.smac.evaluation.play_battles`): ``num_envs`` battles (default
``min(episodes, 256)``) stepped by one compiled call per step on the checkpoint's
``SMAXVectorEnvRunner``, battle ``i`` the one a ``SMACEnv`` plays after ``reset(seed=seed + i)``,
every action mask-checked. ``num_envs=1``, or a config the fused SMAX loop cannot reproduce
(custom connectors, ...: the reason is logged), plays one battle at a time on RLlib's runner.

``video_dir`` (``--video DIR``) wraps a gymnasium env in gymnasium's ``RecordVideo``
(``render_mode="rgb_array"``, one MP4 per episode; needs ``moviepy``, the ``video`` extra).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rllib_ext.cli.envs import check_env
from rllib_ext.cli.errors import CLIError
from rllib_ext.cli.ppo_config import build_algo_config
from rllib_ext.cli.runconfig import resolve_checkpoint, saved_settings

__all__ = ["BATCHED_BATTLES", "EvaluationResult", "evaluate", "load_checkpoint_config"]

logger = logging.getLogger("rllib_ext.cli.evaluate")


@dataclass(frozen=True)
class EvaluationResult:
    checkpoint: Path
    env: str
    returns: tuple[float, ...]
    wins: tuple[bool, ...] = ()
    """SMAC envs: ``battle_won`` of each episode (empty for envs without battles)."""
    explore: bool = False
    video_dir: Path | None = None
    battles_at_once: int = 1
    """Episodes stepped together (SMAX's batched evaluation; 1: RLlib's env runner)."""
    checked_actions: int | None = None
    """Batched SMAX evaluation: agent actions checked against the legal-action mask."""

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
            "battles_at_once": self.battles_at_once,
            "checked_actions": self.checked_actions,
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
    """The algorithm config ``checkpoint`` was trained with (a mutable copy).

    ``rllib-ext train`` checkpoints: rebuilt from their saved settings by the code that built it
    for training (custom env registration, SMAC policy mapping, the env guard included). Other
    RLlib algorithm checkpoints: the config RLlib stored with their env runner, read by
    ``Checkpointable.from_checkpoint`` (RLlib's reader).

    Raises:
        CLIError: neither is readable at ``checkpoint``.
    """
    settings = saved_settings(checkpoint)
    if settings is not None:
        # The user's training callbacks (--callbacks) are not needed to play episodes.
        return build_algo_config(dataclasses.replace(settings, callbacks=[])).copy(
            copy_frozen=False
        )
    # lazy: keeps Ray out of the input checks (a bad path fails at once)
    from ray.rllib.core import COMPONENT_ENV_RUNNER
    from ray.rllib.utils.checkpoints import Checkpointable

    if not (checkpoint / COMPONENT_ENV_RUNNER).is_dir():
        raise CLIError(
            f"checkpoint {str(checkpoint)!r} has no {COMPONENT_ENV_RUNNER}/ directory to read "
            "the algorithm config from. Fix: pass an algorithm checkpoint written by "
            "'rllib-ext train' or Algorithm.save_to_path()."
        )
    # RLlib's reader of its own checkpoints: builds the env runner class stored there.
    runner: Any = Checkpointable.from_checkpoint(checkpoint / COMPONENT_ENV_RUNNER)
    try:
        return runner.config.copy(copy_frozen=False)
    finally:
        runner.stop()


def _restored_runner(config: Any, checkpoint: Path, runner_cls: Any) -> Any:
    """A local ``runner_cls`` with ``checkpoint``'s connector states and trained weights."""
    # lazy: keeps Ray out of the input checks (a bad path fails at once)
    from ray.rllib.core import (
        COMPONENT_ENV_RUNNER,
        COMPONENT_LEARNER,
        COMPONENT_LEARNER_GROUP,
        COMPONENT_RL_MODULE,
    )
    from ray.rllib.core.rl_module import RLModule

    # The learner's copy of the policy is the trained one (the env runner's is the last sync).
    trained = RLModule.from_checkpoint(
        checkpoint / COMPONENT_LEARNER_GROUP / COMPONENT_LEARNER / COMPONENT_RL_MODULE
    )
    runner = runner_cls(config=config)
    try:
        runner.restore_from_path(checkpoint / COMPONENT_ENV_RUNNER)
        runner.set_state({COMPONENT_RL_MODULE: trained.get_state(inference_only=True)})
    except BaseException:
        runner.stop()
        raise
    return runner


def _play(config: Any, checkpoint: Path, episodes: int, explore: bool) -> list[Any]:
    """Episodes of a local env runner with ``checkpoint``'s connectors and trained weights.

    Multi-agent checkpoints (SMAC, PettingZoo) play on RLlib's ``MultiAgentEnvRunner``; their
    episode returns are summed over agents.
    """
    # lazy: keeps Ray out of the input checks (a bad path fails at once)
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    # One env copy: exactly `episodes` episodes, and the same env seed sequence every call.
    config.env_runners(num_env_runners=0, num_envs_per_env_runner=1, explore=explore)
    runner_cls = MultiAgentEnvRunner if config.is_multi_agent else SingleAgentEnvRunner
    runner = _restored_runner(config, checkpoint, runner_cls)
    try:
        return runner.sample(num_episodes=episodes, explore=explore)[:episodes]
    finally:
        runner.stop()


BATCHED_BATTLES = 256
"""Default cap on the SMAX battles one batched evaluation step plays together."""


def _smax_battles(
    config: Any, checkpoint: Path, episodes: int, explore: bool, num_envs: int | None, seed: int
) -> EvaluationResult | str:
    """The batched SMAX evaluation's result, or why it does not apply (then RLlib's runner
    plays the episodes)."""
    from rllib_ext.envs.smac.evaluation import play_battles  # lazy: torch
    from rllib_ext.fused.rules import UnfusedModuleOutputs  # lazy: Ray
    from rllib_ext.runner_table import select_env_runner_class  # lazy: Ray, torch

    battles_at_once = min(episodes, num_envs or BATCHED_BATTLES)
    config.env_runners(num_env_runners=0, num_envs_per_env_runner=battles_at_once, explore=explore)
    choice = select_env_runner_class(config)
    if battles_at_once < 2 or choice.rule != "smax_batched":
        return "not a multi-agent SMAX env with num_envs > 1"
    runner = _restored_runner(config, checkpoint, choice.cls)
    try:
        reason = runner.fused_rule(num_timesteps=1, random_actions=False)
        if reason is not None:
            return reason
        try:
            outcomes = play_battles(runner, episodes, explore=explore, seed=seed)
        except UnfusedModuleOutputs as exc:
            return str(exc)
    finally:
        runner.stop()
    return EvaluationResult(
        checkpoint=checkpoint,
        env=str(config.env),
        returns=tuple(outcomes.returns.tolist()),
        wins=tuple(outcomes.won.tolist()),
        explore=explore,
        battles_at_once=battles_at_once,
        checked_actions=outcomes.checked_actions,
    )


def _recording_env(
    env_id: str, env_config: dict[str, Any], video_dir: str, env_context: Any = None
) -> Any:
    """``env_id`` rendering to ``rgb_array``, one video per episode in ``video_dir``."""
    # lazy: keeps gymnasium out of the input checks
    import gymnasium as gym
    from gymnasium.wrappers import RecordVideo

    env = gym.make(env_id, render_mode="rgb_array", **env_config)
    return RecordVideo(env, video_folder=video_dir, episode_trigger=lambda _: True)


def _record_videos(config: Any, video_dir: Path) -> None:
    """Points ``config`` at a recording copy of its gymnasium env.

    Raises:
        CLIError: moviepy missing, a multi-agent checkpoint, or an env that is no gymnasium id.
    """
    import gymnasium as gym  # lazy: keeps gymnasium out of the input checks

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
    num_envs: int | None = None,
) -> EvaluationResult:
    """Plays ``episodes`` episodes with the policy in ``checkpoint`` (greedy by default).

    Args:
        checkpoint: an algorithm checkpoint or a ``rllib-ext train`` run directory.
        env, env_config: override the checkpoint's env (default: the one it trained on).
        seed: env seed (default: the checkpoint's).
        explore: sample actions from the policy's distribution instead of the greedy action.
        video_dir: record one video per episode there (gymnasium envs, needs ``moviepy``).
        num_envs: SMAX checkpoints: battles played at once (default ``min(episodes, 256)``;
            1: one at a time on RLlib's env runner). Other envs play one episode at a time.

    Raises:
        CLIError: no checkpoint at the path, bad env override, ``episodes < 1``, or a
            ``video_dir`` that cannot be recorded (see :func:`_record_videos`).
    """
    if episodes < 1:
        raise CLIError(f"--episodes {episodes} must be >= 1. Fix: e.g. --episodes 10.")
    if num_envs is not None and num_envs < 1:
        raise CLIError(
            f"--num-envs {num_envs} must be >= 1. Fix: e.g. --num-envs 200, or 1 for one "
            "battle at a time."
        )
    path = resolve_checkpoint(checkpoint, flag="evaluate")
    config = load_checkpoint_config(path).copy(copy_frozen=False)
    if env is not None or env_config is not None:
        env = env or config.env
        env_config = dict(env_config if env_config is not None else config.env_config)
        if not config.is_multi_agent:
            check_env(env, env_config)
        config.environment(env, env_config=env_config)
    if seed is not None:
        config.debugging(seed=seed)
    env_name = str(config.env)
    if video_dir is not None:
        video_dir = Path(video_dir)
        _record_videos(config, video_dir)
    elif num_envs != 1 and config.is_multi_agent:
        batched = _smax_battles(
            config.copy(copy_frozen=False), path, episodes, explore, num_envs, config.seed or 0
        )
        if isinstance(batched, EvaluationResult):
            return batched
        logger.info("evaluate: one episode at a time on RLlib's env runner (%s)", batched)
    from rllib_ext.envs.smac import battle_info  # lazy: keeps Ray out of the input checks

    played = _play(config, path, episodes, explore)
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
