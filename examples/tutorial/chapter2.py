"""Tutorial chapter 2 ("5分钟部署分布式PPO舰队"): the code as printed, only the imports changed.

What each 2023 call becomes on RLlib's new API stack (the README's "Tutorial API" table):
``.resources(num_gpus=2, num_cpus=8)`` -> 2 learners with one GPU each (``num_cpus``: Ray
decides per actor); ``.rollouts(num_rollout_workers=6)`` -> ``.env_runners(num_env_runners=6)``;
``tune.run("PPO", ...)`` -> :class:`rllib_ext.compat.PPO`, whose results carry ``episode_reward_mean``.

On a machine without 2 GPUs and 9 CPUs it stops with one line saying so; run it as
``RLLIB_EXT_FIT_RESOURCES=1 python examples/tutorial/chapter2.py`` to scale the request to the
machine (``RLLIB_EXT_MAX_ITERATIONS=N`` caps the iterations).
"""

# ruff: noqa: E501, I001
# 导入Ray Tune库 - 用于超参数调优和分布式训练
from rllib_ext import tune  # was: from ray import tune

# 导入RLlib的PPO配置类
from rllib_ext.compat import PPOConfig  # was: from ray.rllib.algorithms.ppo import PPOConfig

# 创建PPO算法的配置对象
config = (
    # 初始化PPO配置
    PPOConfig()
    # 设置训练环境为OpenAI Gym的CartPole-v1
    .environment("CartPole-v1")
    # 指定使用PyTorch作为深度学习框架（可选"tf"表示TensorFlow）
    .framework("torch")
    # 配置计算资源：使用2个GPU和8个CPU核心
    .resources(
        num_gpus=2,  # 使用的GPU数量
        num_cpus=8,  # 使用的CPU核心数量
    )
    # 配置rollout workers设置
    .rollouts(
        num_rollout_workers=6  # 使用6个并行worker收集经验数据
    )
    # 配置训练参数
    .training(
        gamma=0.99,  # 折扣因子，用于计算未来奖励的现值
        lr=0.0003,  # 学习率，控制参数更新的步长
    )
)
# 使用Ray Tune运行PPO训练
tune.run(
    "PPO",  # 指定要运行的算法为PPO
    config=config,  # 传入上面配置好的config对象
    # 设置停止条件：当平均回合奖励达到450时停止训练
    stop={"episode_reward_mean": 450},
    # 每10次训练迭代保存一次检查点（可用于恢复训练或模型评估）
    checkpoint_freq=10,
)
