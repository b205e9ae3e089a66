"""Tutorial chapter 3 (通信优化): the plain-dict config as printed, only the imports changed.

The dict's old keys reach :class:`rllib_ext.compat.PPO` through Tune and are mapped there
(``rllib_ext.compat.PPOConfig.update_from_dict``): ``"communication"`` -> ``communication_type="nccl"``,
``grad_compression="fp16"``, ``grad_clip=0.5``; ``"training": {...}`` -> ``.training(...)``;
``"num_gpus": 2`` -> 2 GPU learners; ``"num_workers"`` / ``"num_cpus_per_worker"`` -> env
runners; ``"model"`` -> the RLModule's ``model_config``. ``local_dir`` -> ``storage_path``.

Run: ``RLLIB_EXT_FIT_RESOURCES=1 python examples/tutorial/chapter3.py`` on a machine without
2 GPUs (CPU learners then use gloo instead of NCCL; the fitting logs every change).
"""

# ruff: noqa: E501, I001
# 导入Ray Tune库 - 用于超参数调优和分布式训练
from rllib_ext import tune  # was: from ray import tune

# 导入RLlib的PPO算法（注释中说明，实际使用时不需要显式导入）
# from ray.rllib.algorithms.ppo import PPO
# 创建配置字典，包含分布式训练和PPO算法的所有参数
config = {
    # 通信配置部分 --------------------------------------------------
    "communication": {
        # 指定分布式通信后端，NCCL是NVIDIA GPU的最佳选择
        # 可选值："NCCL"（多GPU）、"gloo"（CPU）、"auto"（自动选择）
        "type": "NCCL",
        # 是否启用梯度压缩，减少worker间的通信量
        # True会使用FP16压缩梯度，节省50%带宽但可能损失少量精度
        "compression": True,
        # 梯度裁剪阈值，防止分布式训练中的梯度爆炸
        # 所有梯度将被裁剪到[-0.5, 0.5]范围内
        "grad_clip": 0.5,
    },
    # 训练配置部分 --------------------------------------------------
    "training": {
        # 是否使用KL散度作为额外正则项
        # True会监控策略更新前后的分布差异，防止更新过大破坏策略稳定性
        "use_kl_loss": True,
        # KL散度系数，控制正则化的强度
        # 0.3表示KL散度损失将占总体损失的30%
        "kl_coeff": 0.3,
        # 以下是实际需要但未在原始代码中展示的典型PPO参数（注释说明）
        # "lambda": 0.95, # GAE参数
        # "clip_param": 0.2, # PPO裁剪范围ε
        # "vf_loss_coeff": 1.0, # 价值函数损失权重
        # "entropy_coeff": 0.01, # 熵奖励系数
    },
    # 环境配置（必须补充的部分）-------------------------------------
    "env": "CartPole-v1",  # 指定训练环境
    # 框架选择（必须补充的部分）-------------------------------------
    "framework": "torch",  # 使用PyTorch框架（可选"tf2"）
    # 资源配置（典型分布式设置）-------------------------------------
    "num_gpus": 2,  # 使用2块GPU
    "num_workers": 6,  # 6个并行worker收集经验
    "num_cpus_per_worker": 1,  # 每个worker分配1个CPU核心
    # 模型架构（典型配置）------------------------------------------
    "model": {
        "fcnet_hiddens": [256, 256],  # 全连接层结构
        "fcnet_activation": "tanh",  # 激活函数
    },
}
# 初始化Ray分布式运行时（实际运行前必须添加）
# ray.init(address="auto") # 连接现有集群
# 或 ray.init(num_gpus=2) # 启动本地Ray实例
# 启动Tune实验运行PPO训练
tune.run(
    "PPO",  # 指定使用PPO算法
    # 传入配置字典
    config=config,
    # 停止条件配置（需要补充）
    stop={
        "episode_reward_mean": 450,  # 当平均回报达到450时停止
        "time_total_s": 3600,  # 或训练1小时后停止（安全限制）
    },
    # 检查点配置（需要补充）
    checkpoint_freq=10,  # 每10次迭代保存检查点
    checkpoint_at_end=True,  # 训练结束时自动保存
    # 日志配置（推荐补充）
    local_dir="./results",  # 结果保存路径
    verbose=2,  # 日志详细级别（0-3）
)
# 典型后续操作（注释说明）：
# 1. 从检查点恢复训练：
# tune.run("PPO", restore="/path/to/checkpoint")
# 2. 结果分析：
# 结果会自动保存在~/ray_results/或指定目录
# 可以使用TensorBoard查看：tensorboard --logdir=./results
