"""The runner side of every fused loop: select, then dispatch (:class:`FusedDispatch`).

A fused loop (the single-agent one of :mod:`rllib_ext.fused_sampling`, the SMAX one of
:mod:`rllib_ext.envs.smac.sampling`) runs inside an RLlib env runner in place of its ``_sample``.
:class:`FusedDispatch` is the runner side: per call its rule decides, before any side effect
(no env reset, no RNG draw, no callback), whether the loop runs or RLlib's own ``_sample`` over
the same env; a fallback is announced once per runner and reason (:class:`FusedSamplingFallback`,
a warning) and RLlib's loop starts afresh after the fused one (each keeps its own episodes in
progress). A loop never hands a call back once it has started it.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Protocol, cast

from rllib_ext.settings import ExtensionSettings

__all__ = ["FusedDispatch", "FusedSamplingFallback"]

logger = logging.getLogger("rllib_ext.fused_sampling")
"""One logger for every fused loop (its name predates this package; log filters key on it)."""

_CHOSEN = ("fused_sampling=False", "random actions")
"""Fallback reasons the caller chose: logged at INFO, not warned."""


class FusedSamplingFallback(UserWarning):
    """RLlib's own sampling loop runs instead of a fused one (the message says why); warned once
    per env runner and reason. ``warnings.simplefilter("ignore", FusedSamplingFallback)``
    silences it; ``env_runners/fused_sampling`` (``smax_fused_sampling``) shows it too."""


class _Sampler(Protocol):
    @property
    def active(self) -> bool: ...

    def drop(self) -> None: ...


class FusedDispatch:
    """Mixin of an env runner with a fused loop, before RLlib's runner in the bases (see the
    module docstring): its ``_sample`` runs :meth:`fused_sample` where :meth:`fused_rule` finds
    no reason against it, else RLlib's ``_sample``. The runner calls :meth:`init_fused` at the
    end of ``__init__``."""

    fused_sampling: bool = True
    """False: always RLlib's loop (class or instance attribute; the ``fused_sampling`` setting
    applies too)."""
    fused_fallback_message = "fused sampling off, RLlib's loop runs: %s"
    """The warning (:class:`FusedSamplingFallback`) given once per runner and reason (``%s``:
    the reason)."""

    fused: _Sampler
    config: Any

    def init_fused(self, sampler: _Sampler) -> None:
        self.fused = sampler
        """The fused loop and the episodes it carries between calls."""
        self._fused_last = False
        self._fallbacks_warned: set[str] = set()
        settings = ExtensionSettings.from_learner_config_dict(self.config.learner_config_dict)
        self._fused_setting_off = not settings.sampling.fused_sampling

    @property
    def fused_last(self) -> bool:
        """Whether the last ``sample()`` ran the fused loop."""
        return self._fused_last

    def fused_rule(
        self, *, num_timesteps: int | None, random_actions: bool, explore: bool | None = None
    ) -> str | None:
        """Why the fused loop cannot reproduce RLlib's for this call (``None``: it can;
        ``explore`` ``None``: the config's). Decides without side effects: no env reset, no RNG
        draw, no callback."""
        raise NotImplementedError

    def fused_sample(
        self,
        *,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        force_reset: bool,
    ) -> list[Any]:
        """The call, sampled by the fused loop."""
        raise NotImplementedError

    def _sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[Any]:
        why_not = (
            "fused_sampling=False"
            if self._fused_setting_off or not self.fused_sampling
            else self.fused_rule(
                num_timesteps=num_timesteps, random_actions=random_actions, explore=explore
            )
        )
        if why_not is None:
            self._fused_last = True
            try:
                return self.fused_sample(
                    num_timesteps=num_timesteps,
                    num_episodes=num_episodes,
                    explore=explore,
                    force_reset=force_reset,
                )
            except BaseException:
                self.fused.drop()  # a step may be half recorded: the next call resets
                raise
        if self.fused.active:  # leaving the fused loop: RLlib's starts afresh
            self.fused.drop()
            force_reset = True
        self._fused_last = False
        self._announce_fallback(why_not)
        rllib_sample = cast(Any, super())._sample  # RLlib's runner, after this mixin
        result: list[Any] = rllib_sample(
            num_timesteps=num_timesteps,
            num_episodes=num_episodes,
            explore=explore,
            random_actions=random_actions,
            force_reset=force_reset,
        )
        return result

    def _announce_fallback(self, why_not: str) -> None:
        """A :class:`FusedSamplingFallback` warning once per runner and reason (repeats: DEBUG).
        What the caller chose (``fused_sampling=False``, random actions) is logged at INFO."""
        if why_not in self._fallbacks_warned:
            logger.debug(self.fused_fallback_message, why_not)
            return
        self._fallbacks_warned.add(why_not)
        if why_not in _CHOSEN:  # nothing to fix
            logger.info(self.fused_fallback_message, why_not)
            return
        warnings.warn(self.fused_fallback_message % why_not, FusedSamplingFallback, stacklevel=2)
