"""What every fused loop does with the chunks it built, as RLlib's loops do: the
``on_episode_end`` call for a finished episode, and the running episodes' chunks registered for
RLlib's episode metrics."""

from __future__ import annotations

from typing import Any

from ray.rllib.callbacks.utils import make_callback

from rllib_ext import _rllib_private as private

__all__ = ["call_on_episode_end", "register_ongoing_chunk"]


def call_on_episode_end(runner: Any, episode: Any, *, env_index: int, env: Any) -> None:
    """RLlib's ``on_episode_end`` call for a finished ``episode`` of vector-env slot
    ``env_index`` (``env``: what the runner's loop passes, its env or ``env.unwrapped``)."""
    make_callback(
        "on_episode_end",
        callbacks_objects=private.runner_callbacks(runner),
        callbacks_functions=runner.config.callbacks_on_episode_end,
        kwargs=dict(
            episode=episode,
            env_runner=runner,
            metrics_logger=runner.metrics,
            env=env,
            rl_module=runner.module,
            env_index=env_index,
            prev_episode_chunks=private.ongoing_episodes_for_metrics(runner)[episode.id_],
        ),
    )


def register_ongoing_chunk(runner: Any, chunk: Any) -> None:
    """Keeps the chunk of a running episode (before its ``to_numpy()``, where the loop converts)
    for RLlib's episode metrics, as RLlib's loop does after its ``cut()``."""
    private.ongoing_episodes_for_metrics(runner)[chunk.id_].append(chunk)
