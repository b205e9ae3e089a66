"""Extension settings: one small dataclass per component, validated in one place.

Both ways of switching components on read these classes:

* ``rllib_ext.PPOConfig().training(gae="vectorized", ...)`` writes the flags into the
  config's ``learner_config_dict``;
* the stock ``ray.rllib.algorithms.ppo.PPOConfig().learners(learner_class=PPOExtTorchLearner,
  learner_config_dict={"gae": "vectorized"})`` puts them there directly.

The learner builds an :class:`ExtensionSettings` from that dict with
:meth:`ExtensionSettings.from_learner_config_dict`, so a bad value fails the same way on
both routes: a ``ValueError`` naming the key, the allowed values and the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

__all__ = [
    "AMP_MODES",
    "AMPSettings",
    "COMM_BACKENDS",
    "COMPRESSORS",
    "CompressionSettings",
    "BATCHING_IMPLS",
    "GAE_IMPLS",
    "STANDARDIZE_MODES",
    "ExtensionSettings",
    "GAESettings",
    "check_comm_resources",
    "extension_keys",
    "split_extension_kwargs",
]

GAE_IMPLS: tuple[str, ...] = ("rllib", "vectorized")
BATCHING_IMPLS: tuple[str, ...] = ("rllib", "vectorized")
STANDARDIZE_MODES: tuple[str, ...] = ("all", "masked", "none")
AMP_MODES: tuple[Any, ...] = (False, "fp16", "bf16", "auto")
COMPRESSORS: tuple[Any, ...] = (None, "fp16", "bf16", "powersgd", "onebit")
COMM_BACKENDS: tuple[str, ...] = ("auto", "nccl", "gloo")


def _check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(
            f"{key}={value!r} is not supported; allowed values: "
            f"{', '.join(repr(a) for a in allowed)}. "
            f"Fix: pass one of them, e.g. .training({key}={allowed[-1]!r})."
        )


@dataclass(frozen=True)
class GAESettings:
    """Generalized advantage estimation in the PPO learner connector."""

    gae: Literal["rllib", "vectorized"] = "vectorized"
    """``"vectorized"``: rllib_ext's exact loop-free kernel and connector; ``"rllib"``: RLlib's
    own ``GeneralAdvantageEstimation`` (unchanged)."""

    batching: Literal["rllib", "vectorized"] = "vectorized"
    """How the learner turns episodes into the train batch. ``"vectorized"``: one fused pass
    (``rllib_ext.connectors.batching``) in place of RLlib's seven default pieces from
    ``AddOneTsToEpisodesAndTruncate`` to ``BatchIndividualItems``, same batch, same episodes
    afterwards; it runs RLlib's pieces itself where it cannot be exact (stateful modules,
    custom pieces in between). ``"rllib"``: RLlib's pieces, unchanged."""

    standardize_advantages: Literal["all", "masked", "none"] = "all"
    """``"all"`` reproduces RLlib: mean/std over every row of the train batch, including the
    one bootstrap row that RLlib appends to each episode chunk (masked out of the loss).
    ``"masked"`` uses only the rows the loss sees; ``"none"`` leaves advantages raw.
    Only ``"all"`` is available with ``gae="rllib"``."""

    def __post_init__(self) -> None:
        _check_choice("gae", self.gae, GAE_IMPLS)
        _check_choice("batching", self.batching, BATCHING_IMPLS)
        _check_choice("standardize_advantages", self.standardize_advantages, STANDARDIZE_MODES)
        if self.gae == "rllib" and self.standardize_advantages != "all":
            raise ValueError(
                f"standardize_advantages={self.standardize_advantages!r} needs gae='vectorized': "
                "RLlib's own GAE connector always standardizes over all rows. Fix: use "
                "gae='vectorized' or leave standardize_advantages at 'all'."
            )


def _check_number(key: str, value: Any, ok: bool, allowed: str, example: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
        raise ValueError(
            f"{key}={value!r} is out of range; allowed: {allowed}. "
            f"Fix: pass e.g. .training({key}={example!r})."
        )


@dataclass(frozen=True)
class AMPSettings:
    """Automatic mixed precision for the PPO learner update (forward and loss under autocast)."""

    amp: Literal[False, "fp16", "bf16", "auto"] = False
    """``False``: fp32 (RLlib's behaviour). ``"fp16"``: float16 autocast with dynamic loss
    scaling (``torch.amp.GradScaler``). ``"bf16"``: bfloat16 autocast, no scaling needed.
    ``"auto"``: fp16 on CUDA, bf16 on CPUs with native bf16 (AVX512-BF16/AMX), else off; the
    choice is logged. ``True`` is read as ``"auto"``."""

    amp_init_scale: float = 1024.0
    """fp16 only: initial loss scale (the tutorial's ``fp16_loss_scaling``)."""

    amp_growth_factor: float = 2.0
    """fp16 only: the scale is multiplied by this after ``amp_growth_interval`` clean steps."""

    amp_backoff_factor: float = 0.5
    """fp16 only: the scale is multiplied by this after a step with inf/nan gradients."""

    amp_growth_interval: int = 200
    """fp16 only: consecutive finite-gradient steps before the scale grows."""

    amp_inference: bool = False
    """Run the env runners' action computation under the same autocast dtype (off: fp32)."""

    def __post_init__(self) -> None:
        if self.amp is True:
            object.__setattr__(self, "amp", "auto")
        if self.amp is None:
            object.__setattr__(self, "amp", False)
        _check_choice("amp", self.amp, AMP_MODES)
        _check_number(
            "amp_init_scale", self.amp_init_scale, self.amp_init_scale > 0, "a number > 0", 1024.0
        )
        _check_number(
            "amp_growth_factor",
            self.amp_growth_factor,
            self.amp_growth_factor > 1,
            "a number > 1",
            2.0,
        )
        _check_number(
            "amp_backoff_factor",
            self.amp_backoff_factor,
            0 < self.amp_backoff_factor < 1,
            "a number in (0, 1)",
            0.5,
        )
        _check_number(
            "amp_growth_interval",
            self.amp_growth_interval,
            isinstance(self.amp_growth_interval, int) and self.amp_growth_interval >= 1,
            "an integer >= 1",
            200,
        )
        if not isinstance(self.amp_inference, bool):
            raise ValueError(
                f"amp_inference={self.amp_inference!r}; allowed: True, False. "
                "Fix: .training(amp_inference=True)."
            )
        if self.amp_inference and self.amp is False:
            raise ValueError(
                "amp_inference=True needs a precision to run inference in, but amp=False. "
                "Fix: also set amp='bf16', 'fp16' or 'auto'."
            )


@dataclass(frozen=True)
class CompressionSettings:
    """Gradient compression between learners (DDP communication hooks; ``num_learners >= 2``)."""

    grad_compression: Literal[None, "fp16", "bf16", "powersgd", "onebit"] = None
    """``None``: DDP's plain fp32 all-reduce (RLlib's behaviour). ``"fp16"``/``"bf16"``: cast
    on the wire (bf16 works on gloo too). ``"powersgd"``: low-rank (``powersgd_rank``) with error
    feedback. ``"onebit"``: sign bits + one scale per bucket over all-gather, error feedback."""

    powersgd_rank: int = 4
    """PowerSGD: rank of the gradient approximation (1-4 typical; higher = closer, more bytes)."""

    powersgd_start_iter: int = 10
    """PowerSGD: plain all-reduce for this many steps first (must be > 1 with error feedback)."""

    compression_error_feedback: bool = True
    """PowerSGD/1-bit: carry the compression error into the next step (per rank)."""

    onebit_warmup_steps: int = 100
    """1-bit: plain all-reduce for this many update steps, recording each gradient element's
    RMS; then 1-bit compression of ``g / rms`` (the frozen RMS, identical on all ranks), the
    1-bit Adam recipe. 0 = plain scaled-sign 1-bit from the first step."""

    comm_backend: Literal["auto", "nccl", "gloo"] = "auto"
    """Process-group backend the learners communicate over; ``"auto"``: NCCL on GPU learners,
    gloo on CPU learners (Ray Train's choice). Checked against the learners' resources."""

    def __post_init__(self) -> None:
        if self.grad_compression is False:
            object.__setattr__(self, "grad_compression", None)
        _check_choice("grad_compression", self.grad_compression, COMPRESSORS)
        _check_choice("comm_backend", self.comm_backend, COMM_BACKENDS)
        _check_number(
            "powersgd_rank",
            self.powersgd_rank,
            isinstance(self.powersgd_rank, int) and self.powersgd_rank >= 1,
            "an integer >= 1",
            4,
        )
        _check_number(
            "powersgd_start_iter",
            self.powersgd_start_iter,
            isinstance(self.powersgd_start_iter, int)
            and self.powersgd_start_iter >= (2 if self.compression_error_feedback else 1),
            "an integer >= 2 with error feedback (DDP rebuilds its buckets after step 1), else >= 1",
            10,
        )
        _check_number(
            "onebit_warmup_steps",
            self.onebit_warmup_steps,
            isinstance(self.onebit_warmup_steps, int) and self.onebit_warmup_steps >= 0,
            "an integer >= 0",
            100,
        )
        if not isinstance(self.compression_error_feedback, bool):
            raise ValueError(
                f"compression_error_feedback={self.compression_error_feedback!r}; allowed: "
                "True, False. Fix: .training(compression_error_feedback=True)."
            )


def check_comm_resources(
    comm: CompressionSettings, *, num_learners: int, num_gpus_per_learner: float
) -> list[str]:
    """Checks the compression settings against the learners' resources.

    Returns:
        Warnings (settings that are valid but have no effect).

    Raises:
        ValueError: for a backend the learners cannot use.
    """
    on_gpu = num_gpus_per_learner > 0
    if comm.comm_backend == "nccl" and not on_gpu:
        raise ValueError(
            "comm_backend='nccl' but the learners have no GPU (num_gpus_per_learner=0); NCCL "
            "only runs between GPUs. Fix: comm_backend='auto' (gloo on CPUs) or "
            ".learners(num_gpus_per_learner=1)."
        )
    if comm.comm_backend == "gloo" and on_gpu:
        raise ValueError(
            "comm_backend='gloo' with GPU learners is not supported: RLlib's learner group "
            "(Ray Train) creates an NCCL process group whenever learners have GPUs. "
            "Fix: comm_backend='auto' or 'nccl'."
        )
    warnings = []
    if comm.grad_compression is not None and num_learners < 2:
        warnings.append(
            f"grad_compression={comm.grad_compression!r} has no effect with num_learners="
            f"{num_learners}: gradients are only exchanged between 2 or more learners. "
            "Set .learners(num_learners=2) or more to use it."
        )
    return warnings


def _communication_alias(block: Any) -> dict[str, Any]:
    """The tutorial's ``communication={"type": ..., "compression": ..., "grad_clip": ...}``."""
    if not isinstance(block, Mapping):
        raise ValueError(
            f"communication={block!r} must be a dict like "
            '{"type": "NCCL", "compression": True, "grad_clip": 0.5}.'
        )
    allowed = {"type", "compression", "grad_clip"}
    unknown = sorted(set(block) - allowed)
    if unknown:
        raise ValueError(
            f"communication keys {unknown} are not supported; allowed: {sorted(allowed)}. "
            "Fix: use grad_compression=..., comm_backend=..., grad_clip=... directly."
        )
    out: dict[str, Any] = {}
    if "type" in block:
        out["comm_backend"] = str(block["type"]).lower()
    if "compression" in block:
        comp = block["compression"]
        # `compression: True` in the tutorial meant fp16 on the wire.
        out["grad_compression"] = "fp16" if comp is True else (None if comp is False else comp)
    if "grad_clip" in block:
        out["grad_clip"] = block["grad_clip"]
    return out


_COMPONENTS: tuple[type, ...] = (GAESettings, AMPSettings, CompressionSettings)

# Old (2023 tutorial / pre-2.10 RLlib) spellings accepted by `rllib_ext.PPOConfig.training()`.
# Each maps to exactly one current setting (the function converts the value).
TRAINING_ALIASES: dict[str, tuple[str, Any]] = {
    "num_sgd_iter": ("num_epochs", lambda v: v),
    "sgd_minibatch_size": ("minibatch_size", lambda v: v),
    "fp16": ("amp", lambda v: "fp16" if v else False),
    "fp16_loss_scaling": ("amp_init_scale", lambda v: v),
}


def extension_keys() -> tuple[str, ...]:
    """All flat keys the extension understands, in declaration order."""
    return tuple(f.name for comp in _COMPONENTS for f in fields(comp))


def _unknown_key_error(key: str, where: str) -> ValueError:
    allowed = extension_keys()
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(
        f"Unknown rllib_ext setting {key!r} in {where}.{hint} Allowed keys: "
        f"{', '.join(allowed)}. Fix: remove the key or use one of the allowed names."
    )


@dataclass(frozen=True)
class ExtensionSettings:
    """All component settings of one learner."""

    gae: GAESettings = field(default_factory=GAESettings)
    amp: AMPSettings = field(default_factory=AMPSettings)
    comm: CompressionSettings = field(default_factory=CompressionSettings)

    @classmethod
    def from_flat(
        cls, flat: Mapping[str, Any], *, where: str = "the settings"
    ) -> ExtensionSettings:
        """Builds settings from flat keys (``{"gae": "vectorized", ...}``).

        Raises:
            ValueError: for an unknown key or a bad value.
        """
        known = set(extension_keys())
        for key in flat:
            if key not in known:
                raise _unknown_key_error(key, where)
        parts = {}
        for comp in _COMPONENTS:
            names = {f.name for f in fields(comp)}
            parts[comp] = comp(**{k: v for k, v in flat.items() if k in names})
        return cls(gae=parts[GAESettings], amp=parts[AMPSettings], comm=parts[CompressionSettings])

    @classmethod
    def from_learner_config_dict(
        cls, learner_config_dict: Mapping[str, Any] | None
    ) -> ExtensionSettings:
        """Reads the extension keys out of an RLlib ``learner_config_dict``.

        Keys starting with ``_`` or ``user_`` are left to the user's own learner code;
        every other key must be an extension key.
        """
        flat = {
            k: v
            for k, v in (learner_config_dict or {}).items()
            if not (str(k).startswith("_") or str(k).startswith("user_"))
        }
        return cls.from_flat(flat, where="learner_config_dict")

    def to_flat(self) -> dict[str, Any]:
        """The flat ``learner_config_dict`` form (inverse of :meth:`from_flat`)."""
        out: dict[str, Any] = {}
        for comp in (self.gae, self.amp, self.comm):
            out.update(asdict(comp))
        return out


def split_extension_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Splits ``.training(**kwargs)`` into (extension flags, RLlib kwargs), resolving aliases."""
    known = set(extension_keys())
    ext: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key == "communication":
            for new, converted in _communication_alias(value).items():
                if new in kwargs:
                    raise ValueError(
                        f"communication sets {new!r}, which was also given directly. "
                        f"Fix: pass {new}=... only once."
                    )
                (ext if new in known else rest)[new] = converted
            continue
        if key in TRAINING_ALIASES:
            new, convert = TRAINING_ALIASES[key]
            if new in kwargs:
                raise ValueError(
                    f"Both {key!r} and {new!r} were given; {key!r} is the old name of {new!r}. "
                    f"Fix: pass only {new}=..."
                )
            key, value = new, convert(value)
        (ext if key in known else rest)[key] = value
    return ext, rest
