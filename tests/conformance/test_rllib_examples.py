"""RLlib's own example scripts, stock vs rllib_ext (issue 40): the harness's comparison on made-up
runs, the substitution in a real process, then the examples themselves (the fast subset here, the
whole set under ``-m conformance`` / ``make conformance``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conformance import rllib_examples as rx

STATS = dict.fromkeys(rx.EPISODE_STATS, 1.0)


def run(
    mode: str = "stock", keys: tuple[str, ...] = ("a", "env_runners/b"), **kw: object
) -> rx.Run:
    iteration = {"keys": list(keys), "episodes": dict(STATS), "fused_sampling": None}
    iteration.update(kw)
    return rx.Run(mode, 0, 1.0, [iteration])


def test_same_runs_conform() -> None:
    row = rx.compare("x", run(), run("rllib_ext", fused_sampling=1.0))
    assert row.conforms and row.identical_first and row.path == "fused"


def test_a_missing_key_does_not_conform() -> None:
    row = rx.compare("x", run(), run("rllib_ext", keys=("a",)))
    assert row.missing_keys == ["env_runners/b"] and not row.conforms


def test_wall_time_keys_are_not_compared() -> None:
    stock = run(keys=("a", "env_runners/b", "perf/cpu_util_percent"))
    assert rx.compare("x", stock, run("rllib_ext")).conforms
    row = rx.compare("x", stock, run("rllib_ext", keys=("a", "perf/cpu_util_percent")))
    assert row.missing_keys == ["env_runners/b"]


def test_only_our_documented_keys_may_be_added() -> None:
    ours = ("a", "env_runners/b", "env_runners/rllib_ext/fused_sampling")
    ours += ("learners/p0/rllib_ext/gae/time_ms",)
    assert rx.compare("x", run(), run("rllib_ext", keys=ours)).conforms
    row = rx.compare("x", run(), run("rllib_ext", keys=(*ours, "episode_reward_mean")))
    assert row.unknown_keys == ["episode_reward_mean"]  # the 2023 names: rllib_ext.compat only
    row = rx.compare("x", run(), run("rllib_ext", keys=("a", "env_runners/b", "learners/p0/gae/x")))
    assert row.unknown_keys == ["learners/p0/gae/x"] and not row.conforms  # not under our prefix


def test_a_replaced_piece_timer_may_be_missing_only_where_ours_ran() -> None:
    gae, ours = (rx.PIECE_TIMERS + p for p in ("general_advantage_estimation", "compiled_gae"))
    assert rx.compare("x", run(keys=("a", gae)), run("rllib_ext", keys=("a", ours))).conforms
    row = rx.compare("x", run(keys=("a", gae)), run("rllib_ext", keys=("a",)))
    assert row.missing_keys == [gae] and not row.conforms
    batch = rx.PIECE_TIMERS + "add_one_ts_to_episodes_and_truncate"
    row = rx.compare("x", run(keys=("a", batch)), run("rllib_ext", keys=("a", ours)))
    assert row.missing_keys == [batch]


def test_other_first_episodes_do_not_conform() -> None:
    other = run("rllib_ext")
    other.iterations[0]["episodes"]["episode_len_max"] = 2.0
    row = rx.compare("x", run(), other)
    assert row.identical_first is False and not row.conforms


def test_a_failed_rllib_ext_run_does_not_conform_a_failed_stock_run_is_reported() -> None:
    failed = rx.Run("rllib_ext", 1, 1.0, [], tail="Traceback\nValueError: boom")
    row = rx.compare("x", run(), failed)
    assert not row.conforms and row.note == "ValueError: boom"
    row = rx.compare("x", rx.Run("stock", 1, 1.0, [], tail="ImportError: gym"), run("rllib_ext"))
    assert row.conforms and not row.stock_ok and row.note == "stock: ImportError: gym"
    assert "| no |" not in rx.table([row]) and "**no**" in rx.table([row])


def test_runs_that_fail_alike_after_training_are_still_compared() -> None:
    def failed(mode: str, **kw: object) -> rx.Run:
        done = run(mode, **kw)  # type: ignore[arg-type]
        done.returncode, done.tail = 1, "Traceback\nFileNotFoundError: /tmp/cartpole"
        return done

    row = rx.compare("x", failed("stock"), failed("rllib_ext"))
    assert row.conforms and row.identical_first and not row.stock_ok
    assert row.note == "both fail alike after training: FileNotFoundError: /tmp/cartpole"
    assert "| **no** | **no** | yes | " in rx.table([row])  # keys compared
    row = rx.compare(
        "x", failed("stock"), failed("rllib_ext", keys=("a", "env_runners/b", "env_runners/new"))
    )
    assert not row.conforms and row.unknown_keys == ["env_runners/new"]
    other = failed("rllib_ext")
    other.tail = "ValueError: boom"
    assert rx.compare("x", failed("stock"), other).conforms  # not alike: stock's failure shown


def test_our_path_names_fallback_reason_and_rllib_rule() -> None:
    fell_back = run("rllib_ext", fused_sampling=0.0)
    fell_back.fallbacks = ["module computes actions"]
    assert rx.our_path(fell_back) == "fallback: module computes actions"
    rllib = run("rllib_ext", env_runner="MultiAgentEnvRunner", rule="rllib_default")
    assert rx.our_path(rllib) == "RLlib's runner MultiAgentEnvRunner (rllib_default)"


def test_a_fallback_reason_ends_where_another_processs_warning_begins() -> None:
    line = (
        "(pid=7) FusedSamplingFallback: fused sampling off, RLlib's loop runs: observation space "
        "Dict (fused: Box)/venv/gymnasium/utils/passive_env_checker.py:245: UserWarning: WARN"
    )
    assert rx.FALLBACK.search(line).group(1) == "observation space Dict (fused: Box)"
    alone = "FusedSamplingFallback: a stateful (recurrent) RLModule"
    assert rx.FALLBACK.search(alone).group(1) == "a stateful (recurrent) RLModule"


def test_bootstrap_puts_rllib_ext_where_scripts_import_rllib(tmp_path) -> None:
    import rllib_ext

    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from ray.rllib.algorithms.ppo import PPO, PPOConfig
            from ray.tune.registry import get_trainable_cls
            print("classes", PPOConfig.__module__, PPO.__module__,
                  get_trainable_cls("PPO").__module__, __name__, sys.argv[1:])
            """
        )
    )
    for mode, home in (
        ("stock", "ray.rllib.algorithms.ppo.ppo"),
        ("rllib_ext", rllib_ext.PPO.__module__),
    ):
        boot = "from tests.conformance.rllib_examples import bootstrap; bootstrap()"
        argv = [mode, str(tmp_path / "dump.json"), str(script), "--flag"]
        out = subprocess.run(
            [sys.executable, "-c", boot, *argv], cwd=rx.REPO, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert f"classes {home} {home} {home} __main__ ['--flag']" in out.stdout


def test_every_ppo_example_script_is_in_the_set_or_named_out() -> None:
    """A Ray release that adds a PPO example script fails here until the script joins the set."""
    scripts = rx.ppo_example_scripts()
    assert len(scripts) > 20  # the discovery itself found Ray's examples
    in_set = {e.path for e in rx.EXAMPLES}
    assert sorted(set(scripts) - in_set - set(rx.NOT_PPO)) == []
    assert sorted(in_set - set(scripts)) == []  # no example the installed Ray lacks
    assert len(in_set) == len(rx.EXAMPLES)


def test_discovery_keeps_ppo_scripts_only(tmp_path) -> None:
    for name, text in {
        "a/ppo.py": "config = PPOConfig()",
        "b/flags.py": "get_trainable_cls(args.algo).get_default_config()",
        "c/dqn.py": "config = DQNConfig()",
        "classes/helper.py": "PPOConfig",
        "_old_api_stack/old.py": "PPOConfig",
        "a/__init__.py": "PPOConfig",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert rx.ppo_example_scripts(tmp_path) == ["a/ppo.py", "b/flags.py"]


def check(example: rx.Example) -> None:
    row, stock, ext = rx.run_pair(example, iters=example.iters)
    if not row.stock_ok:  # nothing to compare against on this machine
        pytest.skip(f"stock RLlib fails this example here: {stock.tail[-500:]}")
    assert row.conforms, f"{rx.table([row])}\n--- rllib_ext run:\n{ext.tail}"
    assert row.path.startswith(example.expect), row.path


@pytest.mark.parametrize("example", [e for e in rx.EXAMPLES if e.fast], ids=lambda e: e.name)
def test_fast_examples_conform(example: rx.Example) -> None:
    check(example)


@pytest.mark.conformance
@pytest.mark.parametrize(
    "example", [e for e in rx.EXAMPLES if e.core and not e.fast], ids=lambda e: e.name
)
def test_examples_conform(example: rx.Example) -> None:
    check(example)


@pytest.mark.conformance  # both marks: `-m "not conformance"` alone leaves these out too
@pytest.mark.conformance_all
@pytest.mark.parametrize(
    "example", [e for e in rx.EXAMPLES if not (e.core or e.fast)], ids=lambda e: e.name
)
def test_more_examples_conform(example: rx.Example) -> None:
    check(example)
