"""``amp`` per device, decided without a GPU: :func:`choose_amp` is a pure function of the device
type and its CUDA compute capability; and the device AMP inference reads off a multi-agent module
(which has no parameters of its own)."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule, MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_ext.amp_choice import choose_amp, resolve_amp_dtype
from rllib_ext.env_runners import module_device

A100, H100, V100, T4 = (8, 0), (9, 0), (7, 0), (7, 5)


@pytest.mark.parametrize(
    ("capability", "expected"), [(H100, "bf16"), (A100, "bf16"), (T4, "fp16"), (V100, "fp16")]
)
def test_auto_on_cuda_is_bf16_from_compute_capability_8(capability, expected) -> None:
    assert choose_amp("auto", "cuda", capability) == expected


@pytest.mark.parametrize(("cpu_bf16", "expected"), [(True, "bf16"), (False, None)])
def test_auto_on_cpu_follows_native_bf16(cpu_bf16, expected) -> None:
    assert choose_amp("auto", "cpu", None, cpu_bf16=cpu_bf16) == expected


@pytest.mark.parametrize("capability", [H100, V100])
def test_explicit_modes_are_kept_where_the_device_runs_them(capability) -> None:
    assert choose_amp("fp16", "cuda", capability) == "fp16"
    assert choose_amp(False, "cuda", capability) is None
    assert choose_amp("bf16", "cpu", None, cpu_bf16=False) == "bf16"  # emulated, with a warning


def test_bf16_on_a_gpu_without_native_bf16_is_one_line_with_the_fix() -> None:
    with pytest.raises(ValueError) as info:
        choose_amp("bf16", "cuda", T4, device_name="Tesla T4")
    message = str(info.value)
    assert "\n" not in message
    for part in ("amp='bf16'", "Tesla T4", "7.5", "'fp16', 'bf16', 'auto'", "Fix: use amp='fp16'"):
        assert part in message
    assert choose_amp("bf16", "cuda", A100) == "bf16"


def test_resolve_on_cpu_is_the_choice_for_this_cpu() -> None:
    from rllib_ext.amp_choice import cpu_has_native_bf16

    expected = "bf16" if cpu_has_native_bf16() else None
    assert choose_amp("auto", "cpu", cpu_bf16=cpu_has_native_bf16()) == expected
    dtypes = {"bf16": torch.bfloat16, None: None}
    assert resolve_amp_dtype("auto", torch.device("cpu")) == dtypes[expected]


def _multi_agent_module() -> MultiRLModule:
    spec = RLModuleSpec(
        module_class=DefaultPPOTorchRLModule,
        observation_space=gym.spaces.Box(-1.0, 1.0, (4,)),
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [8], "head_fcnet_hiddens": [8]},
    )
    return MultiRLModuleSpec(rl_module_specs={"p0": spec, "p1": spec}).build()


def test_device_of_a_multi_agent_module_is_its_sub_modules() -> None:
    multi = _multi_agent_module()
    assert not isinstance(multi, torch.nn.Module)  # no parameters of its own
    assert module_device(multi) == torch.device("cpu")
    for sub_module in multi.values():  # a device other than the CPU default: "meta"
        sub_module.to(torch.device("meta"))
    assert module_device(multi).type == "meta"
    assert module_device(multi["p0"]).type == "meta"


def test_device_of_a_module_without_parameters_is_the_cpu() -> None:
    assert module_device(MultiRLModule(rl_module_specs={})) == torch.device("cpu")
    assert module_device(None) == torch.device("cpu")
