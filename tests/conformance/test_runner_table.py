"""Issue 40, case 2 and the runner table: one function picks the env-runner class, rule by rule.

RLlib's own choice wherever the user or RLlib chose: a user's ``env_runner_cls`` and
``.offline_data(output=...)`` (RLlib's ``OfflineSingleAgentEnvRunner`` records the episodes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.rllib.algorithms.ppo import PPOConfig as StockPPOConfig
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

import rllib_ext
from rllib_ext.env_runners import AMPMultiAgentEnvRunner, AMPSingleAgentEnvRunner
from rllib_ext.envs.smac.env_runner import SMAXVectorEnvRunner
from rllib_ext.fused_sampling import FusedSingleAgentEnvRunner
from rllib_ext.profiling import enable_profiling
from rllib_ext.profiling.env_runner import profiled
from rllib_ext.runner_table import RULES, select_env_runner_class
from tests.conformance._configs import tiny


class UsersRunner(SingleAgentEnvRunner):
    pass


class UsersFusedRunner(FusedSingleAgentEnvRunner):
    pass


def _cartpole(**flags: Any) -> Any:
    return rllib_ext.PPOConfig().environment("CartPole-v1").training(**flags)


def _multi_agent(**flags: Any) -> Any:
    return _cartpole(**flags).multi_agent(policies={"p"}, policy_mapping_fn=lambda *a, **k: "p")


def _smax(num_envs: int) -> Any:
    config = rllib_ext.PPOConfig().environment("smax", env_config={"map_name": "3m"})
    return config.env_runners(num_envs_per_env_runner=num_envs)


def _recording(config: Any, out: Any) -> Any:
    # RLlib records complete episodes only.
    return config.env_runners(batch_mode="complete_episodes").offline_data(output=str(out))


# (config, class the runs use, rule, what env_runner_cls holds: the class or None = RLlib picks)
CASES: dict[str, tuple[Any, type, str, bool]] = {
    "default_single_agent": (_cartpole(), FusedSingleAgentEnvRunner, "fused_single_agent", True),
    "fused_off": (_cartpole(fused_sampling=False), SingleAgentEnvRunner, "rllib_default", False),
    "multi_agent": (_multi_agent(), MultiAgentEnvRunner, "rllib_default", False),
    "amp_single": (
        _cartpole(fused_sampling=False, amp="bf16", amp_inference=True),
        AMPSingleAgentEnvRunner,
        "amp_inference",
        True,
    ),
    "amp_fused": (
        _cartpole(amp="bf16", amp_inference=True),
        FusedSingleAgentEnvRunner,  # opts into AMP inference itself
        "fused_single_agent",
        True,
    ),
    "amp_multi": (
        _multi_agent(amp="bf16", amp_inference=True),
        AMPMultiAgentEnvRunner,
        "amp_inference",
        True,
    ),
    "smax_batched": (_smax(4), SMAXVectorEnvRunner, "smax_batched", True),
    "smax_one_env": (_smax(1), MultiAgentEnvRunner, "rllib_default", False),
    "users_class": (
        _cartpole().env_runners(env_runner_cls=UsersRunner),
        UsersRunner,
        "user_class",
        True,
    ),
    "users_subclass_of_ours": (
        _multi_agent().env_runners(env_runner_cls=UsersFusedRunner),
        UsersFusedRunner,
        "user_class",
        True,
    ),
    "old_api_stack": (
        _cartpole().api_stack(
            enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False
        ),
        None,
        "rllib_old_api_stack",
        False,
    ),
    "offline_output": (
        _recording(_cartpole(), "/tmp/never-written"),
        OfflineSingleAgentEnvRunner,
        "rllib_offline_output",
        False,
    ),
}


def test_every_rule_picks_its_class_and_is_named() -> None:
    seen = set()
    for name, (config, cls, rule, pinned) in CASES.items():
        choice = select_env_runner_class(config)
        assert (choice.cls, choice.rule) == (cls, rule), name
        assert config.env_runner_cls is (cls if pinned else None), name
        config.validate()
        seen.add(rule)
    assert seen == set(RULES)


def test_rules_follow_later_changes() -> None:
    config = _cartpole()
    config.offline_data(output="/tmp/never-written")
    assert config.env_runner_cls is None  # RLlib's recording runner, picked by RLlib
    config.offline_data(output=None)
    assert config.env_runner_cls is FusedSingleAgentEnvRunner
    config.multi_agent(policies={"p"}, policy_mapping_fn=lambda *a, **k: "p")
    assert config.env_runner_cls is None


def test_profiled_variants_follow_the_table(tmp_path: Path) -> None:
    config = enable_profiling(_cartpole(), out_dir=None)
    choice = select_env_runner_class(config)
    assert choice.rule == "profiled:fused_single_agent"
    assert profiled(choice.cls) and choice.cls.__mro__[1] is FusedSingleAgentEnvRunner
    same = config.env_runner_cls
    config.env_runners(rollout_fragment_length="auto")  # re-applies: the same class
    assert config.env_runner_cls is same
    config.offline_data(output=str(tmp_path))
    assert config.env_runner_cls.__mro__[1] is OfflineSingleAgentEnvRunner
    assert select_env_runner_class(config).rule == "profiled:rllib_offline_output"
    # A stock config with output: profiling times RLlib's recording runner, not the plain one.
    stock = enable_profiling(StockPPOConfig().offline_data(output=str(tmp_path)), out_dir=None)
    assert stock.env_runner_cls.__mro__[1] is OfflineSingleAgentEnvRunner

    # A user's class: profiled as it is, one layer above it.
    class MyRunner(SingleAgentEnvRunner):
        pass

    mine = enable_profiling(_cartpole().env_runners(env_runner_cls=MyRunner), out_dir=None)
    assert select_env_runner_class(mine).rule == "profiled:user_class"
    assert profiled(mine.env_runner_cls) and mine.env_runner_cls.__mro__[1] is MyRunner


def _record(config: Any, out: Path) -> list[Path]:
    # Rows, not msgpack'd episode objects: no msgpack_numpy needed (not a Ray dependency).
    config = _recording(tiny(config), out).offline_data(output_write_episodes=False)
    algo = config.build_algo()
    try:
        assert type(algo.env_runner) is OfflineSingleAgentEnvRunner
        algo.train()
    finally:
        algo.stop()
    return sorted(p.relative_to(out) for p in out.rglob("*.parquet"))


def test_offline_output_records_episodes_like_stock(ray_session, tmp_path: Path) -> None:
    stock = _record(StockPPOConfig(), tmp_path / "stock")
    ours = _record(rllib_ext.PPOConfig(), tmp_path / "ours")
    assert stock and ours
    assert {p.parent.parent for p in ours} == {p.parent.parent for p in stock}
