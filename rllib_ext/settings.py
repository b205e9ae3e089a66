"""Extension settings: one small dataclass per component, validated in one place.

Both ways of switching components on read these classes:

* ``rllib_ext.PPOConfig().training(gae="compiled", ...)`` writes the flags into the
  config's ``learner_config_dict``;
* the stock ``ray.rllib.algorithms.ppo.PPOConfig().learners(learner_class=PPOExtTorchLearner,
  learner_config_dict={"gae": "compiled"})`` puts them there directly.

Each field declares everything about one setting: its type (a ``Literal`` lists the choices),
its default, its range (``metadata={"bounds": ...}``) and its docstring. Validation, the
``rllib-ext`` command-line flags and their help are derived from the fields
(:func:`setting_specs`), so a new setting is one edit here. Checks that involve the rest of the
RLlib config live in :mod:`rllib_ext.config_checks`.

The learners' process-group backend is not a setting: RLlib 2.58's ``LearnerGroup`` builds it
with Ray Train's ``TorchConfig()`` (NCCL between GPU learners, gloo between CPU learners) in a
module-level function, not a seam. The tutorial's ``communication={"type": "NCCL"}`` is still
accepted as :attr:`rllib_ext.compat.PPOConfig.communication_type` and checked against the learners'
resources (:func:`rllib_ext.config_checks.check_comm_resources`); the removed ``comm_backend``
key is dropped, with a one-time warning, where stored settings are read (:data:`REMOVED_KEYS`).

No Ray or torch import: the command line reads this module to build its ``--help``.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from rllib_ext._validation import (
    Bounds,
    SettingSpec,
    check_fields,
    check_known_keys,
    field_specs,
    near_miss,
)

__all__ = [
    "AMP_MODES",
    "AMPSettings",
    "BATCHING_IMPLS",
    "BatchingSettings",
    "COMMUNICATION_TYPES",
    "COMPRESSORS",
    "CompressionSettings",
    "ExtensionSettings",
    "GAESettings",
    "GAE_IMPLS",
    "REMOVED_KEYS",
    "STANDARDIZE_MODES",
    "SamplingSettings",
    "SettingSpec",
    "UpdateSettings",
    "extension_keys",
    "setting_specs",
]

logger = logging.getLogger("rllib_ext.settings")


def _bounds(**kwargs: Any) -> dict[str, Any]:
    return {"bounds": Bounds(**kwargs)}


def _check_fields(settings: Any) -> None:
    check_fields(settings, example=lambda key, value: f".training({key}={value!r})")


@dataclass(frozen=True)
class GAESettings:
    """Generalized advantage estimation in the PPO learner connector."""

    gae: Literal["rllib", "compiled"] = "compiled"
    """Advantage estimation. ``"compiled"``: rllib_ext's connector piece, one compiled pass over
    all episode chunks (exact, no Python loop over time steps); ``"rllib"``: RLlib's own
    ``GeneralAdvantageEstimation`` (unchanged)."""

    standardize_advantages: Literal["all", "masked", "none"] = "all"
    """Advantage standardization over all rows (RLlib), only the rows the loss sees, or none.
    ``"all"`` reproduces RLlib: mean/std over every row of the train batch, including the one
    bootstrap row that RLlib appends to each episode chunk (masked out of the loss).
    ``"masked"`` uses only the rows the loss sees; ``"none"`` leaves advantages raw. Only
    ``"all"`` is available with ``gae="rllib"``. With many episode chunks per batch (many
    agents x envs) the bootstrap rows can dominate ``"all"``'s statistics: on SMAX
    3s5z_vs_3s6z with 128 battles their advantages were ~20x a real row's, which left the real
    rows' standardized advantages at std ~0.3 and mean ~-0.2 (the ``smax-jaxmarl-mappo``
    preset takes ``"masked"``)."""

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.gae == "rllib" and self.standardize_advantages != "all":
            raise ValueError(
                f"standardize_advantages={self.standardize_advantages!r} needs gae='compiled': "
                "RLlib's own GAE connector always standardizes over all rows. Fix: use "
                "gae='compiled' or leave standardize_advantages at 'all'."
            )


@dataclass(frozen=True)
class BatchingSettings:
    """How the learner turns episodes into the train batch."""

    batching: Literal["rllib", "vectorized"] = "vectorized"
    """Episodes to train batch: rllib_ext's fused pass or RLlib's own connector pieces.
    ``"vectorized"``: one fused pass (``rllib_ext.connectors.batching``) in place of RLlib's seven default pieces from
    ``AddOneTsToEpisodesAndTruncate`` to ``BatchIndividualItems``, same batch, same episodes
    afterwards, stateful modules' sequences included; it runs RLlib's pieces itself where it
    cannot be exact (custom pieces in between, recurrent episodes without ``state_out``).
    ``"rllib"``: RLlib's pieces, unchanged."""

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True)
class UpdateSettings:
    """How the learner runs each minibatch step."""

    lean_update: bool = True
    """RLlib's update with less work around the maths, the same update within fp32 rounding:
    per minibatch step fused Adam, one finite check over all gradients and foreach norms for
    ``grad_clip_by="global_norm"`` (``rllib_ext.learners.lean``); minibatches gathered by index
    in RLlib's order (``rllib_ext.learners.minibatches``; RLlib's iterator for sequence batches,
    with a warning and ``learners/__all_modules__/rllib_ext/indexed_minibatches`` 0); the
    minibatches' metrics handed to the ``MetricsLogger`` once per update
    (``rllib_ext.learners.deferred_metrics``). ``False``: RLlib's update as it is."""

    compile_update: bool = False
    """Each minibatch's module forward and PPO loss as one ``torch.compile`` graph (inductor),
    its backward compiled with it; the gradient stages after it as without
    (``rllib_ext.learners.compiled_loss``). The same update within fp32 rounding. The first
    update pays the compile (seconds to tens of seconds on a CPU). RLlib's eager step runs
    instead, with a warning and ``learners/__all_modules__/rllib_ext/compiled_update`` 0, for
    several modules, stateful modules, ``num_learners >= 2``, AMP, value normalisation, a
    learner overriding the loss, or where the compile fails."""

    num_minibatches: int = field(default=0, metadata=_bounds(integer=True, ge=0))
    """Minibatches per epoch. ``0``: RLlib's ``minibatch_size`` (rows per minibatch). ``N``:
    each update's minibatch size is the largest module's train batch rows (sequences, for a
    stateful module) divided by ``N``, rounded up, so an epoch has ``N`` minibatches whatever
    the batch's agent count (where the division is exact; else RLlib's iterator carries the
    remainder into the next epoch), as
    JaxMARL's, MAPPO's and CleanRL's ``NUM_MINIBATCHES``; it replaces ``minibatch_size``,
    which RLlib caps at ``train_batch_size`` (env steps, where a multi-agent module's batch
    has agents x env steps rows). One learner only."""

    optimizers: Literal["module", "actor_critic"] = "module"
    """Optimizers per module. ``"module"``: RLlib's one Adam over all of a module's parameters,
    so ``grad_clip`` bounds the policy's and the critic's gradients together. ``"actor_critic"``:
    two Adams per module, ``"critic"`` over the attributes the module names in
    ``critic_attributes()`` where it has one, else ``get_non_inference_attributes()`` (value
    head, critic encoders and cells) and ``"policy"`` over the rest, each clipped by ``grad_clip`` apart (RLlib clips per optimizer) with the config's
    ``lr``: JaxMARL's and MAPPO's separate actor and critic optimizers
    (``rllib_ext.learners.optimizer_groups``; results:
    ``gradients_policy_global_norm`` / ``gradients_critic_global_norm``)."""

    cpu_threads: int = field(default=0, metadata=_bounds(integer=True, ge=0))
    """torch's intra-op threads in a process where the learner runs on the CPU, set with
    ``torch.set_num_threads`` (``rllib_ext._threads``). ``0`` (auto): where ``OMP_NUM_THREADS``
    is unset, one thread when built and, before each update, 1 or 2 by the cores other processes
    left idle since the last one (``/proc/stat``; results: ``rllib_ext/cpu_threads``); where it
    is set (by you, or by Ray in its workers), that count. ``N``: ``N`` threads. Measured in
    ``benchmarks/README.md``, "Thread policy"."""

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True)
class SamplingSettings:
    """How env runners sample (read by rllib_ext's env runners)."""

    fused_sampling: bool = True
    """Array-speed sampling: one batched forward per step instead of RLlib's connector loop.
    ``True``: single-agent runs get ``rllib_ext.fused_sampling.FusedSingleAgentEnvRunner`` and
    SMAX runs the fused SMAX loop, each producing RLlib's episodes and falling back to RLlib's
    loop (logged once, ``env_runners/rllib_ext/fused_sampling`` 0) where it cannot be exact.
    ``False``: RLlib's loop everywhere."""

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True)
class AMPSettings:
    """Automatic mixed precision for the PPO learner update (forward and loss under autocast)."""

    amp: Literal[False, "fp16", "bf16", "auto"] = field(default=False, metadata={"example": "auto"})
    """Mixed precision for the learner update: fp16 (loss scaling), bf16, auto or off (fp32).
    ``False``: fp32 (RLlib's behaviour). ``"fp16"``: float16 autocast with dynamic loss scaling (``torch.amp.GradScaler``).
    ``"bf16"``: bfloat16 autocast, no scaling needed (refused on CUDA GPUs below compute capability
    8.0). ``"auto"``: bf16 on CUDA GPUs with native bf16 (compute capability >= 8.0: A100, H100),
    fp16 on older CUDA GPUs, bf16 on CPUs with native bf16 (AVX512-BF16/AMX), else off; the choice
    is logged. ``True`` is read as ``"auto"``."""

    amp_init_scale: float = field(default=1024.0, metadata=_bounds(gt=0))
    """fp16 only: initial loss scale (the tutorial's ``fp16_loss_scaling``)."""

    amp_growth_factor: float = field(default=2.0, metadata=_bounds(gt=1))
    """fp16 only: the scale is multiplied by this after ``amp_growth_interval`` clean steps."""

    amp_backoff_factor: float = field(default=0.5, metadata=_bounds(gt=0, lt=1))
    """fp16 only: the scale is multiplied by this after a step with inf/nan gradients."""

    amp_growth_interval: int = field(default=200, metadata=_bounds(integer=True, ge=1))
    """fp16 only: consecutive finite-gradient steps before the scale grows."""

    amp_inference: bool = False
    """Run the env runners' action computation under the same autocast dtype (off: fp32)."""

    def __post_init__(self) -> None:
        if self.amp is True:
            object.__setattr__(self, "amp", "auto")
        if self.amp is None:
            object.__setattr__(self, "amp", False)
        _check_fields(self)
        if self.amp_inference and self.amp is False:
            raise ValueError(
                "amp_inference=True needs a precision to run inference in, but amp=False. "
                "Fix: also set amp='bf16', 'fp16' or 'auto'."
            )


@dataclass(frozen=True)
class CompressionSettings:
    """Gradient compression between learners (DDP communication hooks; ``num_learners >= 2``)."""

    grad_compression: Literal[None, "fp16", "bf16", "powersgd", "onebit"] = field(
        default=None, metadata={"example": "powersgd"}
    )
    """Compression of the gradients exchanged between learners (needs ``num_learners >= 2``).
    ``None``: DDP's plain fp32 all-reduce (RLlib's behaviour). ``"fp16"``/``"bf16"``: cast on the wire (bf16 works on gloo
    too). ``"powersgd"``: low-rank (``powersgd_rank``) with error feedback. ``"onebit"``: sign
    bits + one scale per bucket over all-gather, error feedback."""

    powersgd_rank: int = field(default=4, metadata=_bounds(integer=True, ge=1))
    """PowerSGD: rank of the gradient approximation (1-4 typical; higher = closer, more bytes)."""

    powersgd_start_iter: int = field(default=10, metadata=_bounds(integer=True, ge=1))
    """PowerSGD: plain all-reduce for this many steps first (must be > 1 with error feedback)."""

    compression_error_feedback: bool = True
    """PowerSGD/1-bit: carry the compression error into the next step (per rank)."""

    onebit_warmup_steps: int = field(default=100, metadata=_bounds(integer=True, ge=0))
    """1-bit: plain all-reduce steps that record each gradient element's RMS first.
    After them, 1-bit compression of ``g / rms`` (the frozen RMS, identical on all ranks), the
    1-bit Adam recipe. 0 = plain scaled-sign 1-bit from the first step."""

    def __post_init__(self) -> None:
        if self.grad_compression is False:
            object.__setattr__(self, "grad_compression", None)
        _check_fields(self)
        if self.compression_error_feedback and self.powersgd_start_iter < 2:
            raise ValueError(
                f"powersgd_start_iter={self.powersgd_start_iter!r} is out of range; allowed: an "
                "integer >= 2 with error feedback (DDP rebuilds its buckets after step 1), else "
                ">= 1. Fix: pass e.g. .training(powersgd_start_iter=10)."
            )


_COMPONENTS: tuple[type, ...] = (
    GAESettings,
    BatchingSettings,
    UpdateSettings,
    SamplingSettings,
    AMPSettings,
    CompressionSettings,
)


def setting_specs() -> tuple[SettingSpec, ...]:
    """Every flat extension key with its type, choices, default, range and docstring."""
    return tuple(spec for comp in _COMPONENTS for spec in field_specs(comp))


def extension_keys() -> tuple[str, ...]:
    """All flat keys the extension understands, in declaration order."""
    return tuple(spec.name for spec in setting_specs())


def _choices(name: str) -> tuple[Any, ...]:
    return next(spec.choices for spec in setting_specs() if spec.name == name)


GAE_IMPLS: tuple[str, ...] = _choices("gae")
STANDARDIZE_MODES: tuple[str, ...] = _choices("standardize_advantages")
BATCHING_IMPLS: tuple[str, ...] = _choices("batching")
AMP_MODES: tuple[Any, ...] = _choices("amp")
COMPRESSORS: tuple[Any, ...] = _choices("grad_compression")

COMMUNICATION_TYPES: tuple[str, ...] = ("auto", "nccl", "gloo")
"""The tutorial's ``communication={"type": ...}`` values (any case). RLlib picks the backend itself
(NCCL on GPU learners, gloo on CPU); the type is only checked against the learners' resources."""

REMOVED_KEYS: dict[str, str] = {
    "comm_backend": (
        "the setting was removed; RLlib picks the learners' process-group backend itself "
        "(nccl on GPU learners, gloo on CPU)"
    ),
}
"""Keys of earlier versions, tolerated in stored settings (dropped with a one-time warning)."""

_warned_removed: set[str] = set()


def _drop_removed_keys(flat: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """``flat`` without :data:`REMOVED_KEYS`; warns once per process and key."""
    for key in REMOVED_KEYS.keys() & flat.keys():
        if key not in _warned_removed:
            _warned_removed.add(key)
            logger.warning(
                "%s=%r in %s is ignored: %s. (A config or checkpoint from an earlier rllib_ext.)",
                key,
                flat[key],
                where,
                REMOVED_KEYS[key],
            )
    return {k: v for k, v in flat.items() if k not in REMOVED_KEYS}


@dataclass(frozen=True)
class ExtensionSettings:
    """All component settings of one learner."""

    gae: GAESettings = field(default_factory=GAESettings)
    batching: BatchingSettings = field(default_factory=BatchingSettings)
    update: UpdateSettings = field(default_factory=UpdateSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    amp: AMPSettings = field(default_factory=AMPSettings)
    comm: CompressionSettings = field(default_factory=CompressionSettings)

    @classmethod
    def from_flat(
        cls, flat: Mapping[str, Any], *, where: str = "the settings"
    ) -> ExtensionSettings:
        """Builds settings from flat keys (``{"gae": "compiled", ...}``).

        Keys of :data:`REMOVED_KEYS` (settings of earlier versions, e.g. in an old checkpoint's
        config) are dropped with a one-time warning.

        Raises:
            ValueError: for an unknown key or a bad value.
        """
        flat = _drop_removed_keys(flat, where=where)
        check_known_keys(
            flat,
            extension_keys(),
            what=f"rllib_ext setting(s) in {where}",
            fix="remove the key or use one of the allowed names.",
        )
        parts = {}
        for name, comp in typing.get_type_hints(cls).items():
            names = {spec.name for spec in field_specs(comp)}
            parts[name] = comp(**{k: v for k, v in flat.items() if k in names})
        return cls(**parts)

    @classmethod
    def from_learner_config_dict(
        cls, learner_config_dict: Mapping[str, Any] | None
    ) -> ExtensionSettings:
        """Reads the extension keys out of an RLlib ``learner_config_dict``.

        Every other key belongs to the user's own learner code (RLlib's documented
        ``.learners(learner_config_dict={...})``) and is left alone, except a near-miss of an
        extension key (``grad_compresion``, see :func:`~rllib_ext._validation.near_miss`).
        Keys starting with ``_`` or ``user_`` are never read.

        Raises:
            ValueError: a bad value, or a key that misspells an extension key.
        """
        known = extension_keys()
        flat: dict[str, Any] = {}
        for key, value in (learner_config_dict or {}).items():
            if key in known or key in REMOVED_KEYS:
                flat[key] = value
            elif not str(key).startswith(("_", "user_")):
                close = near_miss(str(key), known)
                if close is not None:
                    raise ValueError(
                        f"Unknown rllib_ext setting in learner_config_dict: {key!r} (did you "
                        f"mean {close!r}?); rllib_ext keys: {', '.join(known)} (other keys pass "
                        f"through to your learner). Fix: use {close!r}, or give your own key a "
                        f"name apart from ours (e.g. 'user_{key}')."
                    )
        return cls.from_flat(flat, where="learner_config_dict")

    def to_flat(self) -> dict[str, Any]:
        """The flat ``learner_config_dict`` form (inverse of :meth:`from_flat`)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            out.update(asdict(getattr(self, f.name)))
        return out
