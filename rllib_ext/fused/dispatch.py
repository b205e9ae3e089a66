"""The runner side of every fused loop: select, then dispatch (a :class:`FusedDispatch` the
runner holds).

A fused loop (the single-agent one of :mod:`rllib_ext.fused_sampling`, the SMAX one of
:mod:`rllib_ext.envs.smac.sampling`) runs inside an RLlib env runner in place of its ``_sample``.
The runner's ``_sample`` hands each call to its :class:`FusedDispatch`: the runner's rule
decides, before any side effect (no env reset, no RNG draw, no callback), whether the loop runs
or RLlib's own ``_sample`` over the same env; a fallback is announced once per runner and reason (:class:`FusedSamplingFallback`,
a warning) and RLlib's loop starts afresh after the fused one (each keeps its own episodes in
progress). A loop never hands a call back once it has started it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from rllib_ext.settings import ExtensionSettings

__all__ = ["DEFAULT_FALLBACK_MESSAGE", "FusedDispatch", "FusedLoop", "FusedRunner"]
__all__ += ["FusedSamplingFallback"]

logger = logging.getLogger("rllib_ext.fused_sampling")
"""One logger for every fused loop (its name predates this package; log filters key on it)."""

_CHOSEN = ("fused_sampling=False", "random actions")
"""Fallback reasons the caller chose: logged at INFO, not warned."""


class FusedSamplingFallback(UserWarning):
    """RLlib's own sampling loop runs instead of a fused one (the message says why); warned once
    per env runner and reason. ``warnings.simplefilter("ignore", FusedSamplingFallback)``
    silences it; ``env_runners/rllib_ext/fused_sampling`` (``.../smax_fused_sampling``) shows it
    too."""


class FusedLoop(Protocol):
    """What the dispatch needs of a fused loop (a sampler): whether it carries episodes, and
    forgetting them."""

    @property
    def active(self) -> bool: ...

    def drop(self) -> None: ...


class FusedRunner(Protocol):
    """What the dispatch needs of its env runner: the switch, the config, the loop's rule and
    the loop's call."""

    fused_sampling: bool
    config: Any

    def fused_rule(
        self, *, num_timesteps: int | None, random_actions: bool, explore: bool | None = None
    ) -> str | None:
        """Why the fused loop cannot reproduce RLlib's for this call (``None``: it can;
        ``explore`` ``None``: the config's). Decides without side effects: no env reset, no RNG
        draw, no callback."""
        ...

    def fused_sample(
        self,
        *,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        force_reset: bool,
    ) -> list[Any]:
        """The call, sampled by the fused loop."""
        ...


DEFAULT_FALLBACK_MESSAGE = "fused sampling off, RLlib's loop runs: %s"


class FusedDispatch:
    """One env runner's choice, per ``sample()`` call, between its fused loop and RLlib's (see
    the module docstring). The runner holds one (built at the end of its ``__init__``) and its
    ``_sample`` override hands each call to :meth:`sample` with RLlib's own ``_sample``."""

    def __init__(
        self,
        runner: FusedRunner,
        loop: FusedLoop,
        *,
        fallback_message: str = DEFAULT_FALLBACK_MESSAGE,
    ) -> None:
        self.runner = runner
        self.loop = loop
        """The fused loop and the episodes it carries between calls."""
        self.fallback_message = fallback_message
        """The warning (:class:`FusedSamplingFallback`) given once per runner and reason (``%s``:
        the reason)."""
        self.last = False
        """Whether the last ``sample()`` ran the fused loop."""
        self._warned: set[str] = set()
        settings = ExtensionSettings.from_learner_config_dict(runner.config.learner_config_dict)
        self._setting_off = not settings.sampling.fused_sampling

    def sample(
        self,
        rllib_sample: Callable[..., list[Any]],
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[Any]:
        """The call: the runner's fused loop where its rule finds no reason against it, else
        ``rllib_sample`` (RLlib's ``_sample`` of the runner) over the same env."""
        runner = self.runner
        why_not = (
            "fused_sampling=False"
            if self._setting_off or not runner.fused_sampling
            else runner.fused_rule(
                num_timesteps=num_timesteps, random_actions=random_actions, explore=explore
            )
        )
        if why_not is None:
            self.last = True
            try:
                return runner.fused_sample(
                    num_timesteps=num_timesteps,
                    num_episodes=num_episodes,
                    explore=explore,
                    force_reset=force_reset,
                )
            except BaseException:
                self.loop.drop()  # a step may be half recorded: the next call resets
                raise
        if self.loop.active:  # leaving the fused loop: RLlib's starts afresh
            self.loop.drop()
            force_reset = True
        self.last = False
        self._announce_fallback(why_not)
        return rllib_sample(
            num_timesteps=num_timesteps,
            num_episodes=num_episodes,
            explore=explore,
            random_actions=random_actions,
            force_reset=force_reset,
        )

    def _announce_fallback(self, why_not: str) -> None:
        """A :class:`FusedSamplingFallback` warning once per runner and reason (repeats: DEBUG).
        What the caller chose (``fused_sampling=False``, random actions) is logged at INFO."""
        if why_not in self._warned:
            logger.debug(self.fallback_message, why_not)
            return
        self._warned.add(why_not)
        if why_not in _CHOSEN:  # nothing to fix
            logger.info(self.fallback_message, why_not)
            return
        warnings.warn(self.fallback_message % why_not, FusedSamplingFallback, stacklevel=2)
