"""Which parameters each optimizer of a module steps (the ``optimizers`` setting).

``"module"`` is RLlib's layout: one optimizer over all of a module's parameters (RLlib's
``DEFAULT_OPTIMIZER``). ``"actor_critic"`` gives each module two: ``"critic"`` over the
parameters of the attributes the module names in ``critic_attributes()`` where it has that
method (rllib_ext's recurrent module, whose recurrent critic stays on env runners), else in
``InferenceOnlyAPI.get_non_inference_attributes()`` (the attributes an inference-only copy
drops: the value head and the critic's encoders), and ``"policy"`` over all the others. RLlib's
``Learner.postprocess_gradients_for_module`` clips each optimizer's gradients apart, and keeps
each optimizer's learning rate (the config's ``lr`` or schedule) and Adam moments apart, so the
critic's gradients no longer shrink the policy's under ``grad_clip``: JaxMARL's and MAPPO's
separate actor and critic optimizers, through RLlib's own seam
(``configure_optimizers_for_module``).

A layer both heads read (``vf_share_layers=True``) is not in the critic's attributes: it steps
with the policy and its gradients (from both losses) are clipped with the policy's.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from ray.rllib.core.learner.learner import DEFAULT_OPTIMIZER
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI

from rllib_ext import _rllib_private as private

__all__ = ["CRITIC_OPTIMIZER", "POLICY_OPTIMIZER", "check_saved_layout", "optimizer_groups"]

POLICY_OPTIMIZER = "policy"
CRITIC_OPTIMIZER = "critic"


def _attribute(module: Any, dotted: str) -> Any:
    """``module.a.b`` for ``"a.b"``; ``None`` where a part is missing."""
    return functools.reduce(lambda obj, name: getattr(obj, name, None), dotted.split("."), module)


def _unwrapped(module: Any) -> Any:
    """The module under RLlib's DDP wrapper (``unwrapped()``), else ``module``."""
    unwrapped = getattr(module, "unwrapped", None)
    return unwrapped() if callable(unwrapped) else module


def _critic_attribute_names(module_id: str, module: Any) -> list[str]:
    named = getattr(module, "critic_attributes", None)
    if callable(named):
        return list(named())
    if not isinstance(module, InferenceOnlyAPI):
        raise ValueError(
            f"optimizers='actor_critic' needs a module that names its critic's attributes; module "
            f"{module_id!r} ({type(module).__name__}) does not implement RLlib's InferenceOnlyAPI. "
            "Fix: implement get_non_inference_attributes() on it, or use optimizers='module'."
        )
    return list(module.get_non_inference_attributes())


def _critic_parameters(module_id: str, module: Any) -> list[torch.nn.Parameter]:
    params: list[torch.nn.Parameter] = []
    for name in _critic_attribute_names(module_id, module):
        part = _attribute(module, name)
        if isinstance(part, torch.nn.Parameter):
            params.append(part)
        elif isinstance(part, torch.nn.Module):
            params.extend(part.parameters())
    return params


def optimizer_groups(
    module_id: str, module: Any, params: list[Any], layout: str
) -> list[tuple[str, list[Any]]]:
    """``[(optimizer_name, parameters)]`` for one module; ``params`` is the learner's
    ``get_parameters(module)`` (in the learner's order), each one in exactly one group, in that
    order.

    Raises:
        ValueError: ``"actor_critic"`` on a module without ``InferenceOnlyAPI``, or whose
            critic attributes or policy hold no trainable parameter.
    """
    if layout == "module":
        return [(DEFAULT_OPTIMIZER, list(params))]
    module = _unwrapped(module)
    critic_ids = {id(p) for p in _critic_parameters(module_id, module)}
    critic = [p for p in params if id(p) in critic_ids]
    policy = [p for p in params if id(p) not in critic_ids]
    if not critic or not policy:
        empty = "critic" if not critic else "policy"
        raise ValueError(
            f"optimizers='actor_critic' found no trainable {empty} parameter in module "
            f"{module_id!r} ({type(module).__name__}; critic attributes "
            f"{_critic_attribute_names(module_id, module)}). Fix: use optimizers='module'."
        )
    return [(POLICY_OPTIMIZER, policy), (CRITIC_OPTIMIZER, critic)]


def check_saved_layout(learner: Any, optimizer_state: dict[str, Any], layout: str) -> None:
    """Refuses a saved optimizer state whose optimizers are not this learner's (a checkpoint
    saved with the other ``optimizers`` layout): RLlib would register the saved names as extra
    optimizers and step each parameter twice. Modules this learner does not hold are skipped,
    as RLlib does, and so are modules without optimizers yet (RLlib configures theirs then).

    Raises:
        ValueError: naming the saved and the current optimizers and the fix.
    """
    owners = set(private.optimizer_module_ids(learner))
    for name, saved in optimizer_state.items():
        mid = saved.get("module_id")
        if mid not in learner.module or mid not in owners:
            continue  # RLlib configures a module's optimizers here where it has none yet
        ours = [f"{mid}_{opt}" for opt, _ in learner.get_optimizers_for_module(mid)]
        if name not in ours:
            raise ValueError(
                f"the checkpoint's optimizer {name!r} is not one of this learner's {ours} "
                f"(optimizers={layout!r}). Fix: restore with the optimizers setting the "
                "checkpoint was saved with, or restore without its optimizer state."
            )
