"""Module options that only rllib_ext's learner applies: ``value_norm`` and ``death_masking``.

The masked modules carry these options, but the work happens in ``PPOExtTorchLearner``'s learner
connectors (``UpdateValueNorm``, ``DeathMask``) and loss. Any other learner (RLlib's
``PPOTorchLearner`` on a stock ``PPOConfig``) would train as if they were off. Two checks turn
that silent no-op into one error:

* config time: ``rllib_ext.PPOConfig.validate`` (``rllib_ext.config_checks``) looks at
  ``learner_class`` before Ray starts;
* train time, for configs this package does not validate (RLlib's own ``PPOConfig`` with
  ``rllib_ext.modules.smac_module_spec``): a module with an option on refuses ``forward_train``
  until a learner that applies the options has claimed it with :meth:`claim_learner_options`.

Both raise the message of :func:`learner_options_error`. A learner class declares that it
applies the options with the class attribute :data:`APPLIES_LEARNER_OPTIONS` ``= True``, so the
config check needs no import of the learner.
"""

from __future__ import annotations

from typing import Any

from rllib_ext.modules.value_norm import VALUE_NORM_KEY

__all__ = [
    "APPLIES_LEARNER_OPTIONS",
    "DEATH_MASKING_KEY",
    "LEARNER_APPLIED_KEYS",
    "LearnerOptionsAPI",
    "applies_learner_options",
    "learner_options_error",
    "wants_death_masking",
]

DEATH_MASKING_KEY = "death_masking"
"""``model_config`` key (and module attribute) of death masking (``connectors.death_mask``)."""

LEARNER_APPLIED_KEYS = (VALUE_NORM_KEY, DEATH_MASKING_KEY)

APPLIES_LEARNER_OPTIONS = "rllib_ext_applies_learner_options"
"""Class attribute of a learner class: ``True`` when it applies :data:`LEARNER_APPLIED_KEYS`
(``PPOExtTorchLearner`` sets it; its subclasses inherit it)."""


def applies_learner_options(learner_class: Any) -> bool:
    """Whether ``learner_class`` (a class, or anything else a config holds) declared
    :data:`APPLIES_LEARNER_OPTIONS`."""
    return (
        isinstance(learner_class, type)
        and getattr(learner_class, APPLIES_LEARNER_OPTIONS, False) is True
    )


def wants_death_masking(module: Any) -> bool:
    """Whether an (unwrapped) RLModule asks for death masking (its ``death_masking`` is True)."""
    return getattr(module, DEATH_MASKING_KEY, False) is True


def learner_options_error(asked: list[str], where: str) -> ValueError:
    """The one error for ``asked`` options (keys of ``LEARNER_APPLIED_KEYS``); ``where`` names
    the learner in use, e.g. ``"learner_class=PPOTorchLearner"``."""
    return ValueError(
        f"model_config {', '.join(f'{k}=True' for k in asked)} is applied by "
        f"rllib_ext.PPOExtTorchLearner's learner connectors, but {where}, where it would "
        "silently do nothing. Fix: .learners(learner_class=rllib_ext."
        "PPOExtTorchLearner) (or a subclass of it), or turn the option off."
    )


class LearnerOptionsAPI:
    """Mixin for modules with ``value_norm`` / ``death_masking`` options.

    The module class provides ``value_norm`` (a ``ValueNorm`` or ``None``) and ``death_masking``
    (bool); ``_forward_train`` calls :meth:`check_learner_options` first.
    """

    _learner_options_claimed: bool = False

    def learner_options(self) -> list[str]:
        """The options of ``LEARNER_APPLIED_KEYS`` this module has on, sorted."""
        on = []
        if getattr(self, VALUE_NORM_KEY, None) is not None:
            on.append(VALUE_NORM_KEY)
        if wants_death_masking(self):
            on.append(DEATH_MASKING_KEY)
        return sorted(on)

    def claim_learner_options(self) -> None:
        """Called by the learner that applies the options (``PPOExtTorchLearner.build``)."""
        self._learner_options_claimed = True

    def check_learner_options(self) -> None:
        """Raises unless every option on has been claimed by a learner that applies it.

        Raises:
            ValueError: an option is on and no such learner claimed this module.
        """
        if self._learner_options_claimed:
            return
        asked = self.learner_options()
        if asked:
            raise learner_options_error(
                asked,
                "forward_train ran in a learner that is not a PPOExtTorchLearner (RLlib's "
                "PPOTorchLearner is the stock PPOConfig's default)",
            )
