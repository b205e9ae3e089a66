"""Every read or write of a non-public RLlib / torch name in rllib_ext, one small function each.

rllib_ext extends RLlib through its seams (subclasses with ``@override``, connector pieces,
callbacks, env-runner classes). Where no seam exists the package touches a private name, and
only through a function of this module. :data:`PRIVATE_NAMES` (``_private_names.py``) lists each name with its owner
and kind; :func:`missing_private_names` checks them against the installed Ray and torch
(``tests/test_rllib_private.py``, and ``rllib-ext doctor``), so a release that renames one fails
at one named line instead of computing something different.

Nothing here imports Ray or torch at module level: owners are resolved when checked or used.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from rllib_ext._private_check import PrivateName, problems
from rllib_ext._private_names import (
    CYCLIC_ITERATOR_SETTINGS,
    LOSS_MASK_ADDED,
    PRIVATE_NAMES,
    ZERO_PADDED,
)

__all__ = ["PRIVATE_NAMES", "PrivateName", "check_component", "cpu_has_amx", "cpu_has_avx512_bf16"]
__all__ += ["done_episodes_for_metrics", "encoder_config", "env_to_module", "fix_spaces"]
__all__ += ["foreach_mul_", "foreach_norm", "increase_sampled_metrics", "learner_connector"]
__all__ += ["learner_index", "learner_param", "log_env_steps_sampled", "mark_loss_mask_added"]
__all__ += ["mark_zero_padded"]
__all__ += ["metrics_state_stats", "missing_private_names", "module_forward_in_eval_mode"]
__all__ += ["module_to_env", "multi_agent_episode_from_parts", "needs_initial_reset"]
__all__ += ["ongoing_episodes_for_metrics", "optimizer_module_ids", "registered_env_creator"]
__all__ += ["reload_ray_config", "runner_callbacks", "runner_seed", "set_episode_clock"]
__all__ += ["slices_by_sequence"]
__all__ += ["set_needs_initial_reset", "torch_grad_scaler_class", "torch_lr_scheduler_classes"]
__all__ += ["try_env_reset", "try_env_step", "user_model_config", "weights_seq_no"]
__all__ += ["with_metrics_state_stats", "cyclic_iterator_settings", "logged_stats_kind"]
__all__ += ["compute_off_policyness"]


def missing_private_names(
    names: Iterable[PrivateName] = PRIVATE_NAMES,
    *,
    import_module: Callable[[str], ModuleType] = importlib.import_module,
) -> list[str]:
    """One line per listed name the installed Ray / torch lacks (``[]``: all present).

    Each line reads ``<owner> has no <kind> <name> (used by <what>)``.
    """
    return problems(names, import_module=import_module)


# ---------------------------------------------------------------------------------------------
# Learners


def learner_connector(learner: Any) -> Any:
    """The learner's connector pipeline (``None`` with aggregator actors)."""
    return learner._learner_connector


def compute_off_policyness(learner: Any, batch: Any) -> None:
    """Logs the minibatch's off-policyness as ``TorchLearner``'s update step does."""
    learner._compute_off_policyness(batch)


def learner_index(learner: Any) -> int:
    """This learner's rank in the learner group (0 for a local learner)."""
    return int(learner._learner_index)


def learner_param(learner: Any, param_ref: Any) -> Any:
    """The parameter tensor behind ``param_ref`` (a key of the gradient dict)."""
    return learner._params[param_ref]


def optimizer_module_ids(learner: Any) -> list[Any]:
    """The module ids that own at least one optimizer."""
    return list(learner._module_optimizers)


def slices_by_sequence(module_batch: Any) -> bool:
    """Whether RLlib's minibatch iterator slices ``module_batch`` by sequence (``seq_lens``)."""
    return bool(getattr(module_batch, "_slice_seq_lens_in_B", False))


def cyclic_iterator_settings(batch_iter: Any) -> dict[str, Any]:
    """A ``MiniBatchCyclicIterator``'s train batch and settings, as keywords for its
    constructor (before it yielded anything)."""
    return {name: getattr(batch_iter, f"_{name}") for name in CYCLIC_ITERATOR_SETTINGS}


def logged_stats_kind(logger: Any, key: tuple[Any, ...]) -> tuple[str, Any] | None:
    """``(reduce, window)`` of a ``MetricsLogger``'s stats under ``key``; ``None``: none yet."""
    stats = logger._get_key(key, key_error=False)
    identifier = getattr(stats, "stats_cls_identifier", None)
    if identifier is None:
        return None
    return str(identifier), getattr(stats, "_window", None)


def check_component(obj: Any, name: str, components: Any, not_components: Any) -> bool:
    """``Checkpointable._check_component``: whether ``get_state`` should include ``name``."""
    return bool(obj._check_component(name, components, not_components))


# ---------------------------------------------------------------------------------------------
# Env runners


def env_to_module(runner: Any) -> Any:
    """The runner's env-to-module connector pipeline."""
    return runner._env_to_module


def module_to_env(runner: Any) -> Any:
    """The runner's module-to-env connector pipeline."""
    return runner._module_to_env


def runner_callbacks(runner: Any) -> list[Any]:
    """The runner's ``RLlibCallback`` objects."""
    return list(runner._callbacks)


def needs_initial_reset(runner: Any) -> bool:
    """Whether the runner's next ``sample()`` must reset its envs first."""
    return bool(runner._needs_initial_reset)


def set_needs_initial_reset(runner: Any, value: bool) -> None:
    runner._needs_initial_reset = value


def runner_seed(runner: Any) -> Any:
    """The seed the runner resets its envs with on the first reset (``None``: none)."""
    return runner._seed


def weights_seq_no(runner: Any) -> int:
    """The sequence number of the weights the runner's module holds."""
    return int(runner._weights_seq_no)


def ongoing_episodes_for_metrics(runner: Any) -> Any:
    """``defaultdict(list)``: episode id -> earlier chunks of a running episode."""
    return runner._ongoing_episodes_for_metrics


def done_episodes_for_metrics(runner: Any) -> list[Any]:
    """The list of finished chunks ``get_metrics()`` reduces (mutated in place)."""
    done: list[Any] = runner._done_episodes_for_metrics
    return done


def log_env_steps_sampled(runner: Any, num_steps: int) -> None:
    """RLlib's env-steps counter metric (Ray's metrics), as its loop logs it per step."""
    runner._log_env_steps(metric=runner._metrics_num_env_steps_sampled, num_steps=num_steps)


def try_env_reset(runner: Any, *, seed: Any) -> Any:
    """``(observations, infos)`` of the runner's vector env reset by RLlib's fault-tolerant
    reset (``ENV_RESET_TIMER``; a failing env is re-created and reset again)."""
    return runner._try_env_reset(seed=seed, options=None)


def try_env_step(runner: Any, actions: Any) -> Any:
    """The vector env's ``step(actions)`` results by RLlib's fault-tolerant step
    (``ENV_STEP_TIMER``), or RLlib's ``ENV_STEP_FAILURE`` after it re-created the env."""
    return runner._try_env_step(actions)


def increase_sampled_metrics(runner: Any, num_steps: int, num_episodes: int) -> None:
    """``SingleAgentEnvRunner``'s per-call sample counters (env/agent/module steps, episodes)."""
    runner._increase_sampled_metrics(num_steps, num_episodes)


# ---------------------------------------------------------------------------------------------
# Connectors, episodes, modules, config


def module_forward_in_eval_mode(module: Any, batch: Any, *, explore: bool, t: int) -> Any:
    """``module.forward_exploration(batch, t=t)`` (or ``forward_inference(batch)``) for a torch
    RLModule the caller already put in eval mode: RLlib's ``TorchRLModule`` public forwards only
    switch the module to eval mode and back around these hooks (a walk over every submodule
    twice per step); a module that overrides the public forward itself gets it called."""
    # lazy: Ray out of --help
    from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

    cls = type(module)
    if explore:
        if cls.forward_exploration is TorchRLModule.forward_exploration:
            return module._forward_exploration(batch, t=t)
        return module.forward_exploration(batch, t=t)
    if cls.forward_inference is TorchRLModule.forward_inference:
        return module._forward_inference(batch)
    return module.forward_inference(batch)


def set_episode_clock(episode: Any, *, start_time: Any, last_step_time: Any) -> None:
    """A ``SingleAgentEpisode``'s duration clock (``get_duration_s``), as its loop sets it."""
    episode._start_time = start_time
    episode._last_step_time = last_step_time


def fix_spaces(pipeline: Any) -> None:
    """Recomputes a connector pipeline's spaces after its pieces were replaced."""
    pipeline._fix_spaces(pipeline.input_observation_space, pipeline.input_action_space)


def mark_loss_mask_added(shared_data: dict[str, Any]) -> None:
    """Tells later pieces (``AddTimeDimToBatchAndZeroPad``) the loss mask is in the batch."""
    shared_data[LOSS_MASK_ADDED] = True


def mark_zero_padded(shared_data: dict[str, Any], module_id: Any) -> None:
    """Tells ``Learner.update`` that ``module_id``'s columns are time-ranked and zero-padded
    (it then builds that module's ``SampleBatch`` with ``_zero_padded=True``)."""
    shared_data[f"{ZERO_PADDED}{module_id}"] = True


def multi_agent_episode_from_parts(
    *,
    agent_to_module: Mapping[Any, Any],
    env_t_to_agent_t: Any,
    start_time: float | None,
    last_step_time: float | None,
    **public: Any,
) -> Any:
    """``MultiAgentEpisode.from_state`` with no hanging values and ``agent_episodes=[]``.

    ``public`` holds the public keys of ``get_state()`` (``id_``, ``observation_space``,
    ``env_t_started``, ``env_t``, ``agent_t_started``, ``is_terminated`` ...); the caller sets
    ``episode.agent_episodes`` afterwards.
    """
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode  # lazy: Ray out of --help

    return MultiAgentEpisode.from_state(
        {
            **public,
            "_agent_to_module_mapping": dict(agent_to_module),
            "env_t_to_agent_t": env_t_to_agent_t,
            "_hanging_actions_end": {},
            "_hanging_extra_model_outputs_end": defaultdict(dict),
            "_hanging_rewards_end": defaultdict(float),
            "_hanging_rewards_begin": defaultdict(float),
            "agent_episodes": [],
            "_start_time": start_time,
            "_last_step_time": last_step_time,
        }
    )


def encoder_config(*, observation_space: Any, model_config_dict: dict[str, Any]) -> Any:
    """The encoder config RLlib's catalog builds for ``observation_space``."""
    from ray.rllib.core.models.catalog import Catalog  # lazy: keeps Ray out of --help

    return Catalog._get_encoder_config(
        observation_space=observation_space, model_config_dict=model_config_dict
    )


def user_model_config(config: Any) -> Any:
    """The model config as the user gave it (without the algorithm's auto-included keys)."""
    return config._model_config


def torch_lr_scheduler_classes(config: Any) -> Any:
    """``.experimental(_torch_lr_scheduler_classes=...)`` (``None`` when unset or empty)."""
    return getattr(config, "_torch_lr_scheduler_classes", None) or None


def torch_grad_scaler_class(config: Any) -> Any:
    """``.experimental(_torch_grad_scaler_class=...)`` (``None`` when unset)."""
    return getattr(config, "_torch_grad_scaler_class", None)


def registered_env_creator(name: str) -> Any:
    """The creator ``register_env(name, ...)`` stored (``None``: not registered)."""
    from ray.tune.registry import ENV_CREATOR, _global_registry  # lazy: Ray out of --help

    if not _global_registry.contains(ENV_CREATOR, name):
        return None
    return _global_registry.get(ENV_CREATOR, name)


def metrics_state_stats(metrics_state: Mapping[str, Any]) -> dict[str, Any]:
    """``MetricsLogger.get_state()``'s stats by flat key (the key path joined by ``"--"``)."""
    return dict(metrics_state.get("stats", {}))


def with_metrics_state_stats(metrics_state: Mapping[str, Any], stats: Any) -> dict[str, Any]:
    """``metrics_state`` with its stats replaced by ``stats`` (flat keys, as read)."""
    return {**metrics_state, "stats": dict(stats)}


def reload_ray_config() -> None:
    """Re-reads Ray's ``RAY_*`` variables into this process's Ray config, as Ray does itself
    after it sets ``RAY_AUTH_MODE`` (the config is read once, when ``ray`` is imported)."""
    import ray._raylet  # lazy: keeps Ray out of --help

    ray._raylet.Config.initialize("")


# ---------------------------------------------------------------------------------------------
# torch


def foreach_norm(tensors: list[Any]) -> list[Any]:
    """``[t.norm(2) for t in tensors]`` in torch's foreach kernel (grouped by device/dtype)."""
    import torch  # lazy: keeps torch out of --help

    return list(torch._foreach_norm(tensors, 2.0))


def foreach_mul_(tensors: list[Any], factor: Any) -> None:
    """``t.mul_(factor)`` for every tensor, in torch's foreach kernel (``factor``: a scalar tensor)."""
    import torch  # lazy: keeps torch out of --help

    torch._foreach_mul_(tensors, factor)


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU has native bf16 matmuls (AVX512-BF16)."""
    import torch  # lazy: keeps torch out of --help

    return bool(torch.cpu._is_avx512_bf16_supported())


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles."""
    import torch  # lazy: keeps torch out of --help

    return bool(torch.cpu._is_amx_tile_supported())
