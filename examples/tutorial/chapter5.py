"""Tutorial chapter 5 (SMAC 3s5z_vs_3s6z, one shared policy): the code as printed, imports changed.

``"smac_v2"`` runs StarCraft II through SMACv2 when it is installed, otherwise JaxMARL's SMAX
(``pip install "rllib-ext[smax]"``); ``env_runners/rllib_ext/win_rate`` is in every result.
``.resources(num_gpus=4, num_cpus=32)`` -> 4 GPU learners; ``.rollouts(num_rollout_workers=24)``
-> 24 env runners; ``num_sgd_iter=5`` -> ``num_epochs=5``; ``fp16=True`` -> ``amp="fp16"``;
``policy_mapping_fn=lambda agent_id: ...`` is called with the agent id only, as in 2023.

Fixes where the tutorial itself is broken (each marked ``# FIX`` below):

1. its chain starts with ``.environment(...)`` on nothing: ``PPOConfig()`` is added as the first
   link (its comment "初始化PPO配置基类" says that is what it meant);
2. the follow-up steps it leaves in comments (best checkpoint, ``PPO(config=config)``,
   ``restore``, ``evaluate``) are run, with ``PPO`` imported from rllib_ext.

Run: ``RLLIB_EXT_FIT_RESOURCES=1 RLLIB_EXT_MAX_ITERATIONS=3 python examples/tutorial/chapter5.py``.
"""

# ruff: noqa: E501, I001
from rllib_ext import tune  # was: from ray import tune
from rllib_ext.compat import PPOConfig  # was: from ray.rllib.algorithms.ppo import PPOConfig

# 创建PPO算法的详细配置对象
config = (
    # 初始化PPO配置基类
    PPOConfig()  # FIX 1: missing in the tutorial's chain
    # 环境配置 -----------------------------------------------------------------
    .environment(
        # 指定环境名称（SMAC V2环境）
        "smac_v2",
        # 环境特定配置参数
        env_config={
            # 设置SMAC地图场景（3个狂战士+5个追猎者 vs 3个狂战士+6个追猎者）
            "map_name": "3s5z_vs_3s6z",
            # 以下是SMAC常用但未在原始代码中展示的参数（注释说明）：
            # "reward_only_positive": False, # 是否只使用正奖励
            # "obs_last_action": True, # 观测中包含上一个动作
            # "state_last_action": True, # 状态中包含上一个动作
            # "obs_own_health": True # 观测中包含自身血量
        },
    )
    # 多智能体配置 -------------------------------------------------------------
    .multi_agent(
        # 定义策略集（这里使用共享策略）
        policies={
            # 定义一个名为"shared_policy"的共享策略
            # 所有智能体将共用同一个策略网络
            "shared_policy": (
                None,  # 使用默认策略配置
                None,  # 使用默认观测空间
                None,  # 使用默认动作空间
                {},  # 自定义策略配置（可留空）
            )
        },
        # 策略映射函数（决定每个agent使用哪个策略）
        policy_mapping_fn=lambda agent_id: "shared_policy",
        # 以下是多智能体常用但未展示的参数（注释说明）：
        # "count_steps_by": "env_steps", # 步数计数方式
        # "replay_mode": "independent", # 经验回放模式
        # "policy_map_capacity": 100 # 策略映射缓存大小
    )
    # 训练参数配置 -------------------------------------------------------------
    .training(
        # 每次采样数据后的SGD迭代次数（影响训练稳定性）
        num_sgd_iter=5,
        # 启用混合精度训练（FP16）
        fp16=True,
        # KL散度系数（控制策略更新幅度）
        kl_coeff=0.5,
        # GAE(lambda)参数（平衡偏差和方差）
        lambda_=0.95,
        # 以下是PPO关键但未展示的参数（注释说明）：
        # "clip_param": 0.2, # PPO裁剪参数
        # "vf_loss_coeff": 1.0, # 价值函数损失权重
        # "entropy_coeff": 0.01, # 熵正则系数
        # "train_batch_size": 4000, # 训练批次大小
        # "sgd_minibatch_size": 500 # SGD小批次大小
    )
    # 计算资源配置 ------------------------------------------------------------
    .resources(
        # 分配GPU数量（4块GPU用于训练）
        num_gpus=4,
        # 分配CPU核心数量（32个逻辑核心）
        num_cpus=32,
        # 以下是资源相关但未展示的参数（注释说明）：
        # "num_gpus_per_worker": 0.1, # 每个worker分配的GPU量
        # "num_cpus_per_worker": 1, # 每个worker分配的CPU
        # "placement_strategy": "SPREAD" # 资源分配策略
    )
    # 数据收集配置 ------------------------------------------------------------
    .rollouts(
        # 设置并行收集数据的worker数量（24个worker）
        num_rollout_workers=24,
        # 以下是数据收集相关但未展示的参数（注释说明）：
        # "num_envs_per_worker": 2, # 每个worker并行运行的环境数
        # "rollout_fragment_length": 200, # 每个片段的最大步数
        # "batch_mode": "truncate_episodes" # 批次处理模式
    )
)
# 完整训练启动代码 ----------------------------------------------------------
if __name__ == "__main__":
    # 初始化Ray（实际运行必需）
    # ray.init(address="auto", num_gpus=4, num_cpus=32)
    # 启动训练实验
    analysis = tune.run(
        "PPO",
        config=config.to_dict(),
        # 停止条件（根据SMAC场景调整）
        stop={
            "episode_reward_mean": 20.0,  # 平均奖励阈值
            "timesteps_total": 1e7,  # 总时间步限制
            "training_iteration": 1000,  # 最大迭代次数
        },
        # 检查点配置
        checkpoint_freq=10,
        checkpoint_at_end=True,
        # 资源分配验证
        resources_per_trial=config.resources_total,
        # 日志配置
        local_dir="./smac_results",
        verbose=3,
    )
    # 训练完成后可进行的操作（注释说明）：FIX 2: run them
    # 1. 加载最佳检查点：
    best_checkpoint = analysis.best_checkpoint
    # 2. 创建评估器：
    from rllib_ext.compat import PPO  # was: from ray.rllib.algorithms.ppo import PPO

    trainer = PPO(config=config)
    trainer.restore(best_checkpoint)
    # 3. 运行评估：
    eval_results = trainer.evaluate()
