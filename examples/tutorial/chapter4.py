"""Tutorial chapter 4 (混合精度): the code as printed, only the imports changed.

``.training(fp16=True, fp16_loss_scaling=1024.0)`` -> rllib_ext's AMP learner
(``amp="fp16"``, ``amp_init_scale=1024.0``: autocast + dynamic loss scaling inside RLlib's
learner); ``.resources(num_gpus=1)`` -> the local learner on one GPU; ``model={...}`` -> the
RLModule's ``model_config``. The hand-written ``CustomTrainer`` / ``train()`` below is the
tutorial's illustration of plain PyTorch AMP; the RLlib run does not call it.

Run: ``RLLIB_EXT_FIT_RESOURCES=1 python examples/tutorial/chapter4.py`` without a GPU (the
learner then runs fp16 autocast on the CPU).
"""

# ruff: noqa: E501, I001
import torch
import torch.optim as optim
from torch.cuda.amp import GradScaler  # 梯度缩放器

from rllib_ext import tune  # was: from ray import tune
from rllib_ext.compat import PPOConfig  # was: from ray.rllib.algorithms.ppo import PPOConfig

# 初始化梯度缩放器（用于混合精度训练）
scaler = GradScaler(
    init_scale=1024.0,  # 初始缩放因子，与fp16_loss_scaling对应
    growth_factor=2.0,  # 动态调整缩放时的增长系数
    backoff_factor=0.5,  # 当出现梯度溢出时缩小的系数
    growth_interval=200,  # 没有溢出时每隔多少迭代增大缩放因子
)
# 创建PPO配置对象
config = (
    PPOConfig()
    .environment("CartPole-v1")
    .framework("torch")
    .resources(num_gpus=1)
    # 启用RLlib内置的混合精度训练 -------------------------------
    .training(
        fp16=True,  # 开启FP16混合精度训练
        fp16_loss_scaling=1024.0,  # 初始损失缩放因子
        # 以下是必须关联配置的其他参数
        lr=3e-4,  # 通常需要更小的学习率
        clip_param=0.2,  # PPO裁剪参数
        gamma=0.99,  # 折扣因子
        kl_coeff=0.3,  # KL散度系数
        # 模型架构配置
        model={"fcnet_hiddens": [256, 256], "fcnet_activation": "relu"},
    )
)


# 自定义训练步骤（演示PyTorch原生AMP用法）----------------------
class CustomTrainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def train_step(self, obs_batch, actions):
        """执行单次混合精度训练步骤"""
        # 清空梯度
        self.optimizer.zero_grad()
        # 开启autocast上下文（自动选择FP16/FP32计算）
        with torch.cuda.amp.autocast(
            enabled=True,  # 显式启用
            dtype=torch.float16,  # 使用FP16
            cache_enabled=True,  # 启用自动转换缓存
        ):
            # 前向传播（自动选择精度）
            action_logits = self.model(obs_batch)
            # 计算损失（自动保持足够精度）
            loss = self.compute_loss(action_logits, actions)
        # 梯度缩放反向传播
        scaler.scale(loss).backward()  # 缩放后的反向传播
        # 梯度裁剪（混合精度下特别重要）
        scaler.unscale_(self.optimizer)  # 先取消缩放进行裁剪
        torch.nn.utils.clip_grad_norm_(
            self.model.parameters(),
            max_norm=0.5,  # 与config中的grad_clip对应
        )
        # 梯度更新（自动处理缩放）
        scaler.step(self.optimizer)
        # 更新缩放因子（根据梯度情况动态调整）
        scaler.update()
        return loss.item()


# 训练循环示例 ------------------------------------------------
def train():
    # 初始化模型和优化器
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2)
    ).cuda()
    optimizer = optim.Adam(model.parameters(), lr=3e-4)
    trainer = CustomTrainer(model, optimizer)
    # 模拟训练循环
    for epoch in range(100):
        # 模拟数据批次
        obs_batch = torch.randn(32, 4).cuda()  # batch_size=32, obs_dim=4
        actions = torch.randint(0, 2, (32,)).cuda()
        # 执行混合精度训练步骤
        loss = trainer.train_step(obs_batch, actions)
        if epoch % 10 == 0:
            print(f"Epoch {epoch}, Loss: {loss:.4f}")


# 启动RLlib训练（混合精度将自动应用）-------------------------
if __name__ == "__main__":
    # 注意：实际RLlib训练不需要手动实现CustomTrainer
    # 以下展示如何通过Tune启动训练
    tune.run(
        "PPO",
        config=config.to_dict(),
        stop={"episode_reward_mean": 450},
        checkpoint_freq=10,
        verbose=2,
    )
