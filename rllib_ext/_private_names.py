"""The registry of every non-public RLlib / torch name rllib_ext touches: :data:`PRIVATE_NAMES`,
each with its owner, kind and user. :mod:`rllib_ext._rllib_private` holds the one function per
access and checks these names (:func:`rllib_ext._rllib_private.missing_private_names`).

Nothing here imports Ray or torch: owners are ``"module:Class"`` strings, resolved when checked.
"""

from __future__ import annotations

from rllib_ext._private_check import PrivateName

__all__ = ["CYCLIC_ITERATOR_SETTINGS", "LOSS_MASK_ADDED", "PRIVATE_NAMES", "ZERO_PADDED"]

_LEARNER = "ray.rllib.core.learner.learner:Learner"
_PPO_LEARNER = "ray.rllib.algorithms.ppo.ppo_learner:PPOLearner"
_TORCH_LEARNER = "ray.rllib.core.learner.torch.torch_learner:TorchLearner"
_ENV_RUNNER = "ray.rllib.env.env_runner:EnvRunner"
_MA_RUNNER = "ray.rllib.env.multi_agent_env_runner:MultiAgentEnvRunner"
_MA_EPISODE = "ray.rllib.env.multi_agent_episode:MultiAgentEpisode"
_CYCLIC_ITERATOR = "ray.rllib.utils.minibatch_utils:MiniBatchCyclicIterator"
# Its constructor's keywords, each kept as `self._<keyword>`.
CYCLIC_ITERATOR_SETTINGS = (
    "batch num_epochs minibatch_size shuffle_batch_per_epoch num_total_minibatches".split()
)
_SERIES_STATS = "ray.rllib.utils.metrics.stats.series:SeriesStats"
_SA_RUNNER = "ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner"
_SA_EPISODE = "ray.rllib.env.single_agent_episode:SingleAgentEpisode"
_CONFIG = "ray.rllib.algorithms.algorithm_config:AlgorithmConfig"
_SAMPLE_BATCH = "ray.rllib.policy.sample_batch:SampleBatch"
_TORCH_RL_MODULE = "ray.rllib.core.rl_module.torch.torch_rl_module:TorchRLModule"
_CHECKPOINTABLE = "ray.rllib.utils.checkpoints:Checkpointable"
_METRICS_LOGGER = "ray.rllib.utils.metrics.metrics_logger:MetricsLogger"
_PIPELINE = "ray.rllib.connectors.connector_pipeline_v2:ConnectorPipelineV2"
_ADD_ONE_TS = "ray.rllib.connectors.learner.add_one_ts_to_episodes_and_truncate:"
_ADD_ONE_TS += "AddOneTsToEpisodesAndTruncate"
LOSS_MASK_ADDED = "_added_loss_mask_for_valid_episode_ts"
_ADD_TIME_DIM = "ray.rllib.connectors.common.add_time_dim_to_batch_and_zero_pad:"
_ADD_TIME_DIM += "AddTimeDimToBatchAndZeroPad"
ZERO_PADDED = "_zero_padded_for_mid="  # + the module id; Learner reads it

_RUNNER_PRIVATE_ATTRIBUTES = (
    "_env_to_module _module_to_env _callbacks _needs_initial_reset _ongoing_episodes_for_metrics "
    "_done_episodes_for_metrics _seed _weights_seq_no"
).split()

# The state layout of MultiAgentEpisode.get_state() that the fused SMAX chunks are built from.
_EPISODE_PRIVATE_STATE_KEYS = (
    "_agent_to_module_mapping _hanging_actions_end _hanging_extra_model_outputs_end "
    "_hanging_rewards_end _hanging_rewards_begin _start_time _last_step_time"
).split()

PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(_PPO_LEARNER, "_learner_connector", "attribute", "learners/ppo.py: GAE, batching"),
    PrivateName(_LEARNER, "_learner_index", "attribute", "learners/ppo.py: rank-0 logging"),
    PrivateName(_TORCH_LEARNER, "_params", "attribute", "learners/ppo.py: AMP unscaled grads"),
    PrivateName(_TORCH_LEARNER, "_module_optimizers", "attribute", "learners/ppo.py: AMP"),
    PrivateName(_LEARNER, "_create_iterator_if_necessary", "method", "learners/ppo.py"),
    PrivateName(_TORCH_LEARNER, "_uncompiled_update", "method", "learners/ppo.py: AMP, compile"),
    PrivateName(_TORCH_LEARNER, "_compute_off_policyness", "method", "learners/ppo.py: compile"),
    *(
        PrivateName(_CYCLIC_ITERATOR, f"_{name}", "attribute", "learners/minibatches.py")
        for name in CYCLIC_ITERATOR_SETTINGS
    ),
    PrivateName(_CHECKPOINTABLE, "_check_component", "method", "learners/ppo.py: get_state"),
    PrivateName(_SAMPLE_BATCH, "_slice_seq_lens_in_B", "attribute", "minibatches.py: sizes"),
    # Both runners set these in their own __init__: fused loops (SMAX and single-agent), their
    # selection rules, AMP's cast piece and profiling's marks read them.
    *(
        PrivateName(runner, name, "attribute", "fused loops, AMP, profiling")
        for runner in (_MA_RUNNER, _SA_RUNNER)
        for name in _RUNNER_PRIVATE_ATTRIBUTES
    ),
    PrivateName(_ENV_RUNNER, "_metrics_num_env_steps_sampled", "attribute", "fused metrics"),
    PrivateName(_ENV_RUNNER, "_log_env_steps", "method", "fused loops' metrics"),
    PrivateName(_ENV_RUNNER, "_try_env_reset", "method", "fused_sampling/sampler.py: reset"),
    PrivateName(_ENV_RUNNER, "_try_env_step", "method", "fused_sampling/sampler.py: step"),
    PrivateName(_SA_RUNNER, "_increase_sampled_metrics", "method", "fused_sampling: counters"),
    PrivateName(_TORCH_RL_MODULE, "_forward_exploration", "method", "fused_sampling/policy.py"),
    PrivateName(_TORCH_RL_MODULE, "_forward_inference", "method", "fused_sampling/policy.py"),
    PrivateName(_SA_EPISODE, "_start_time", "attribute", "fused_sampling/chunks.py: clock"),
    PrivateName(_SA_EPISODE, "_last_step_time", "attribute", "fused_sampling/chunks.py: clock"),
    *(
        PrivateName(_MA_EPISODE, key, "state_key", "fused SMAX episode chunks")
        for key in _EPISODE_PRIVATE_STATE_KEYS
    ),
    PrivateName(_PIPELINE, "_fix_spaces", "method", "connectors/batching.py: pipeline surgery"),
    PrivateName(_ADD_ONE_TS, LOSS_MASK_ADDED, "data_key", "connectors/batching.py: shared_data"),
    PrivateName(_ADD_TIME_DIM, ZERO_PADDED, "data_key", "connectors/batching.py: shared_data"),
    PrivateName(
        "ray.rllib.core.models.catalog:Catalog",
        "_get_encoder_config",
        "method",
        "modules/masked_ppo.py: central critic encoder",
    ),
    PrivateName(_CONFIG, "_model_config", "attribute", "config.py: tutorial model= alias"),
    PrivateName(_CONFIG, "_torch_grad_scaler_class", "attribute", "config_checks.py: scalers"),
    PrivateName(_CONFIG, "_torch_lr_scheduler_classes", "attribute", "learners/ppo.py: lean"),
    PrivateName("ray.tune.registry", "_global_registry", "attribute", "envs: registered envs"),
    PrivateName(_METRICS_LOGGER, "stats", "state_key", "learners/checkpoint_state.py: our metrics"),
    PrivateName(_METRICS_LOGGER, "_get_key", "method", "learners/deferred_metrics.py"),
    PrivateName(_SERIES_STATS, "_window", "attribute", "learners/deferred_metrics.py"),
    PrivateName("ray._raylet:Config", "initialize", "method", "cli/ray_auth.py: RAY_AUTH_MODE"),
    PrivateName("torch", "_foreach_norm", "function", "learners/lean.py: clipping"),
    PrivateName("torch", "_foreach_mul_", "function", "learners/lean.py: clipping"),
    PrivateName("torch.cpu", "_is_avx512_bf16_supported", "function", "amp='auto', doctor"),
    PrivateName("torch.cpu", "_is_amx_tile_supported", "function", "amp='auto', doctor"),
)
