"""Live progress of ``rllib-ext train``: a tqdm bar on a terminal, one log line per iteration
otherwise (CI logs, pipes)."""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass

from tqdm.auto import tqdm

__all__ = ["IterationStats", "ProgressReporter", "estimate_eta"]

logger = logging.getLogger("rllib_ext.cli")


@dataclass(frozen=True)
class IterationStats:
    """What the bar shows after one ``algo.train()`` call."""

    iteration: int
    env_steps: int
    episode_return_mean: float
    steps_per_s: float
    elapsed_s: float
    win_rate: float | None = None
    """SMAC envs: ``env_runners/rllib_ext/win_rate``."""


def estimate_eta(
    history: list[IterationStats],
    *,
    stop_reward: float | None,
    stop_timesteps: int | None,
    time_budget: float | None,
) -> float | None:
    """Seconds until the first stop criterion is expected to hit, or ``None`` if unknown.

    The reward estimate extrapolates the return linearly over the last four iterations; it is
    a rough guide (PPO learning curves are not linear) and only used while the return rises.
    """
    if not history:
        return None
    last = history[-1]
    estimates: list[float] = []
    if stop_timesteps is not None and last.steps_per_s > 0:
        estimates.append(max(0.0, (stop_timesteps - last.env_steps) / last.steps_per_s))
    if time_budget is not None:
        estimates.append(max(0.0, time_budget - last.elapsed_s))
    recent = [h for h in history[-4:] if math.isfinite(h.episode_return_mean)]
    if stop_reward is not None and len(recent) >= 2:
        times = [h.elapsed_s for h in recent]
        returns = [h.episode_return_mean for h in recent]
        mean_t, mean_r = sum(times) / len(times), sum(returns) / len(returns)
        var_t = sum((t - mean_t) ** 2 for t in times)
        if var_t > 0:
            slope = (
                sum((t - mean_t) * (r - mean_r) for t, r in zip(times, returns, strict=True))
                / var_t
            )
            if slope > 0:
                estimates.append(max(0.0, (stop_reward - returns[-1]) / slope))
    return min(estimates) if estimates else None


def _format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class ProgressReporter:
    """Shows iteration, env steps, return, steps/s and ETA.

    Args:
        enabled: ``True`` forces the bar, ``False`` logs lines, ``None`` picks the bar only
            when stderr is a terminal.
    """

    def __init__(
        self,
        *,
        stop_reward: float | None,
        stop_timesteps: int | None,
        time_budget: float | None,
        initial_env_steps: int = 0,
        enabled: bool | None = None,
    ) -> None:
        self._stop_reward = stop_reward
        self._stop_timesteps = stop_timesteps
        self._time_budget = time_budget
        self.history: list[IterationStats] = []
        use_bar = sys.stderr.isatty() if enabled is None else enabled
        self._bar = None
        if use_bar:
            self._bar = tqdm(
                total=stop_timesteps,
                initial=initial_env_steps,
                unit="step",
                unit_scale=True,
                dynamic_ncols=True,
                desc="train",
                bar_format=(
                    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} env steps "
                    "[{elapsed}{postfix}]"
                    if stop_timesteps
                    else "{desc}: {n_fmt} env steps [{elapsed}{postfix}]"
                ),
            )

    @property
    def uses_bar(self) -> bool:
        return self._bar is not None

    def update(self, stats: IterationStats) -> None:
        previous = self.history[-1].env_steps if self.history else None
        self.history.append(stats)
        eta = estimate_eta(
            self.history,
            stop_reward=self._stop_reward,
            stop_timesteps=self._stop_timesteps,
            time_budget=self._time_budget,
        )
        win = f"win rate {stats.win_rate:.2f} | " if stats.win_rate is not None else ""
        text = (
            f"it {stats.iteration} | return {stats.episode_return_mean:.1f} | {win}"
            f"{stats.steps_per_s:,.0f} steps/s | ETA {_format_seconds(eta)}"
        )
        if self._bar is None:
            logger.info("%s | env steps %s", text, f"{stats.env_steps:,}")
            return
        self._bar.set_postfix_str(text, refresh=False)
        delta = stats.env_steps - (previous if previous is not None else self._bar.n)
        if self._bar.total is not None and self._bar.n + delta > self._bar.total:
            # The last iteration overshoots --stop-timesteps: tqdm would show "0% N/?".
            self._bar.total = self._bar.n + delta
        self._bar.update(max(0, delta))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
