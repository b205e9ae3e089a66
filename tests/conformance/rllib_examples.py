"""RLlib's own example scripts as a conformance suite (issue 40): each runs twice in a fresh
process, once with stock RLlib and once with ``rllib_ext.PPO`` / ``PPOConfig`` put in RLlib's
place, and the two runs are compared.

TEST HARNESS ONLY, not package code: :func:`bootstrap` replaces ``PPO`` and ``PPOConfig`` in
``ray.rllib.algorithms.ppo`` (and ``.ppo.ppo``) before the script imports them, seeds every config
the script builds and wraps ``Algorithm.train`` / ``tune.Tuner.fit`` to write what each iteration
reported (flattened result keys, episode statistics, ``env_runners/rllib_ext/fused_sampling``, the
``FusedSamplingFallback`` warnings) to a JSON file. rllib_ext itself patches nothing in Ray.

The set is every PPO example script of the installed Ray (:func:`ppo_example_scripts`; a test
fails where one is neither in :data:`EXAMPLES` nor in :data:`NOT_PPO`). ``python -m
tests.conformance.rllib_examples [--fast | --core] [--json PATH]`` (``make conformance-table``)
runs them and prints the table; it exits 1 where a row does not conform. ``make conformance`` (CI)
runs the ``core`` and ``fast`` ones as tests, ``make conformance-all`` all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SEED = 7
EPISODE_STATS = (
    "num_episodes",
    "episode_return_mean",
    "episode_return_min",
    "episode_return_max",
    "episode_len_mean",
    "episode_len_min",
    "episode_len_max",
)
"""``env_runners/<stat>`` of the first iteration, compared where our path is exact."""
LENGTHS = tuple(s for s in EPISODE_STATS if "return" not in s)
OUR_KEY = re.compile(r"(^|/)rllib_ext/")
"""Result keys rllib_ext adds: all under its own prefix (README, "Components")."""
FUSED_KEY = "rllib_ext/fused_sampling"
"""``env_runners/<this>``: 1 where the last ``sample()`` ran the fused loop."""
FALLBACK = re.compile(
    r"FusedSamplingFallback: (?:fused sampling off, RLlib's loop runs: )?(.*?)(?:/\S+\.py:\d+: |$)"
)
"""The reason of a fallback warning in a log line; another process's warning (``/path.py:N: ...``)
may follow it on the same line."""
FALLBACK_PREFIX = "fused sampling off, RLlib's loop runs: "
CAP_ENV = "RLLIB_EXT_CONFORMANCE_ITERS"
"""Set for a script that takes no RLlib example flags: its Tune runs stop after that many
iterations, and its own loop ends (exit 0) after that many new-stack ``train()`` calls (harness
only)."""


@dataclass(frozen=True)
class Example:
    """One example script (path under ``ray/rllib/examples``) and its extra flags."""

    path: str
    args: tuple[str, ...] = ()
    tune: bool = False
    """Run through Tune (the script's default) instead of ``--no-tune``."""
    fast: bool = False
    """In the default pytest selection."""
    core: bool = False
    """In ``make conformance`` (and CI) besides the fast ones; the rest run under ``make
    conformance-all``."""
    iters: int = 2
    """Training iterations per run (``--stop-iters``)."""
    expect: str = ""
    """How :func:`our_path` must begin for this example (the tests check it)."""
    stats: tuple[str, ...] = EPISODE_STATS
    """The first iteration's ``env_runners`` statistics that two stock runs reproduce, compared
    between stock and rllib_ext."""
    unseeded: str = ""
    """Why two stock runs differ in the statistics left out of ``stats``."""
    script_flags: bool = True
    """The script takes RLlib's example flags (``add_rllib_example_script_args``); where it does
    not, it gets none, and unless ``short`` the harness gives its configs what the flags give the
    others (no remote env runners) and caps its training at ``iters`` iterations
    (:data:`CAP_ENV`)."""
    runners: int = 0
    """``--num-env-runners`` (0: the local runner samples)."""
    short: bool = False
    """A script without RLlib's flags whose own stop rule ends it within minutes: not capped."""
    num_cpus: int = 2
    """Ray's logical CPUs (``--num-cpus``, and Ray's ``RAY_OVERRIDE_RESOURCES`` for a script that
    starts Ray again after the flags' run). More than the 2 cores only where the script itself
    asks for more actors than that (they then share the cores instead of waiting forever)."""

    @property
    def name(self) -> str:
        return self.path.removesuffix(".py")


FUSED, RLLIB_MA = "fused", "RLlib's runner MultiAgentEnvRunner (rllib_default)"
CONNECTORS = "fallback: custom env-to-module connectors"
EXAMPLES = (
    Example("learners/separate_vf_lr_and_optimizer.py", fast=True, expect=FUSED),
    Example("connectors/mean_std_filtering.py", fast=True, expect=CONNECTORS),
    Example(
        "multi_agent/multi_agent_cartpole.py", ("--num-agents", "2"), fast=True, expect=RLLIB_MA
    ),
    Example("learners/ppo_with_custom_loss_fn.py", core=True, expect=FUSED),
    Example("learners/ppo_with_torch_lr_schedulers.py", core=True, expect=FUSED),
    Example("connectors/prev_actions_prev_rewards.py", core=True, expect=CONNECTORS),
    Example(
        "rl_modules/action_masking_rl_module.py",
        core=True,
        expect="fallback: observation space Dict",
        stats=LENGTHS,
        unseeded="lengths only: the env's rewards come from an unseeded gym space",
    ),
    Example(
        "envs/custom_gym_env.py",
        core=True,
        expect=FUSED,
        stats=LENGTHS,
        unseeded="lengths only: the env reseeds `random` from the OS at each reset",
    ),
    Example("envs/env_w_protobuf_observations.py", core=True, expect=CONNECTORS),
    Example(
        "multi_agent/custom_heuristic_policy.py",
        core=True,
        expect=RLLIB_MA,
        stats=(),
        unseeded="not compared: the random policy samples an unseeded gym space",
    ),
    Example(
        "rl_modules/custom_lstm_rl_module.py",
        tune=True,
        core=True,
        expect="fallback: a stateful (recurrent) RLModule",
    ),
    Example("connectors/flatten_observations_dict_space.py"),
    Example("connectors/single_agent_observation_preprocessor.py"),
    Example("connectors/multi_agent_observation_preprocessor.py", ("--num-agents", "2")),
    Example("envs/agents_act_in_sequence.py"),
    Example("envs/agents_act_simultaneously.py"),
    Example("envs/async_gym_env_vectorization.py"),
    Example("envs/custom_env_render_method.py"),
    Example("envs/env_connecting_to_rllib_w_tcp_client.py", ("--use-dummy-client",), runners=1),
    Example("multi_agent/different_spaces_for_agents.py"),
    Example("multi_agent/multi_agent_pendulum.py", ("--num-agents", "2")),
    Example("multi_agent/rock_paper_scissors_heuristic_vs_learned.py"),
    Example("multi_agent/rock_paper_scissors_learned_vs_learned.py"),
    Example("multi_agent/two_step_game_with_grouped_agents.py", ("--num-agents", "2")),
    Example("multi_agent/pettingzoo_independent_learning.py", ("--num-agents", "2")),
    Example("multi_agent/pettingzoo_parameter_sharing.py", ("--num-agents", "2")),
    Example(
        "multi_agent/self_play_with_open_spiel.py",
        # After training, the script plays against a human on stdin unless told not to.
        ("--num-agents", "2", "--num-episodes-human-play", "0"),
        tune=True,
        stats=(),
        unseeded=(
            "not compared: its random opponent samples an unseeded gym space, and agents map to"
            " policies by the random episode ID"
        ),
    ),
    Example(
        "multi_agent/self_play_league_based_with_open_spiel.py",
        ("--num-agents", "2"),
        stats=(),
        unseeded="not compared: the league's random policies sample an unseeded gym space",
    ),
    Example(
        "offline_rl/cartpole_recording.py",
        ("--stop-timesteps", "2000"),
        tune=True,
        # Its recording stage starts Ray again and evaluates on 5 remote env runners: with Ray's
        # 2 CPUs of this machine they never start (the runs waited until the timeout).
        num_cpus=8,
    ),
    Example("offline_rl/train_w_bc_finetune_w_ppo.py"),
    Example(
        "rl_modules/pretraining_single_agent_training_multi_agent.py",
        ("--num-agents", "2", "--stop-reward-pretraining", "10"),
        tune=True,
    ),
    Example("rl_modules/custom_cnn_rl_module.py"),
    Example("connectors/frame_stacking.py"),
    Example("envs/env_rendering_and_recording.py"),
    Example("ray_tune/custom_experiment.py", tune=True, script_flags=False, short=True),
    Example("ray_tune/custom_logger.py", tune=True, script_flags=False),
    Example("ray_tune/custom_progress_reporter.py", tune=True, script_flags=False),
    Example("rl_modules/migrate_modelv2_to_new_api_stack_by_config.py", script_flags=False),
    Example(
        "rl_modules/migrate_modelv2_to_new_api_stack_by_policy_checkpoint.py", script_flags=False
    ),
    # It takes its checkpoint from Tune's results; `--no-render`: no display here.
    Example("ray_serve/ray_serve_with_rllib.py", ("--no-render",), tune=True),
)


NOT_PPO = {
    "algorithms/appo_custom_algorithm_w_shared_data_actor.py": "APPO (rllib_ext changes PPO only)",
    "ray_tune/appo_hyperparameter_tune.py": "APPO (rllib_ext changes PPO only)",
}
"""Scripts that :func:`ppo_example_scripts` finds but that train no PPO, and why."""
NOT_SCRIPTS = ("_old_api_stack", "classes", "utils")
"""Folders of ``ray/rllib/examples`` that hold RLlib's old API stack or helpers, not scripts of
the new stack (rllib_ext builds on the new stack only)."""


def examples_dir() -> Path:
    import ray.rllib.examples  # lazy: the table and --help need no Ray

    return Path(ray.rllib.examples.__file__).parent


def ppo_example_scripts(root: Path | None = None) -> list[str]:
    """Every example script under ``root`` (default: the installed Ray's ``rllib/examples``) that
    can train PPO: it builds a ``PPOConfig`` or takes ``--algo`` (RLlib's example flags, default
    PPO) through ``get_trainable_cls(args.algo)``."""
    root = root or examples_dir()
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if path.name == "__init__.py" or set(relative.parts[:-1]) & set(NOT_SCRIPTS):
            continue
        text = path.read_text()
        if "PPOConfig" in text or "get_trainable_cls(args.algo)" in text:
            found.append(relative.as_posix())
    return found


# --------------------------------------------------------------------------------------------
# In the example's process (harness only).


def _flat_keys(result: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in result.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and key != "config":
            yield from _flat_keys(value, f"{path}/")
        else:
            yield path


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number else number  # NaN: no value


def _iteration(result: Mapping[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    runners = result.get("env_runners") or {}
    return {
        "keys": sorted(set(_flat_keys(result))),
        "episodes": {k: _number(runners.get(k)) for k in EPISODE_STATS},
        "fused_sampling": _number(runners.get(FUSED_KEY)),
        **extra,
    }


def _substitute() -> None:
    """rllib_ext's PPO and PPOConfig where scripts import RLlib's (harness only)."""
    import ray.rllib.algorithms.ppo as ppo_package
    import ray.rllib.algorithms.ppo.ppo as ppo_module

    import rllib_ext

    for module in (ppo_package, ppo_module):
        module.PPO = rllib_ext.PPO
        module.PPOConfig = rllib_ext.PPOConfig


def rllib_ext_config() -> type:
    import rllib_ext  # lazy: the stock run imports no rllib_ext

    return rllib_ext.PPOConfig


def bootstrap(argv: list[str] | None = None) -> None:
    """``MODE DUMP SCRIPT [ARGS...]``: runs SCRIPT as ``__main__`` with RLlib's PPO (``stock``) or
    rllib_ext's (``rllib_ext``), recording each iteration to DUMP (JSON)."""
    import logging
    import runpy
    import warnings

    from ray import tune
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    mode, dump, script, *script_args = argv if argv is not None else sys.argv[1:]
    state: dict[str, Any] = {"mode": mode, "iterations": [], "fallbacks": []}

    def write() -> None:
        Path(dump).write_text(json.dumps(state, indent=1, default=str))

    if mode == "rllib_ext":
        _substitute()

    build_algo = AlgorithmConfig.build_algo

    capped = bool(os.environ.get(CAP_ENV))

    def seeded_build_algo(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.seed is None:
            self.debugging(seed=SEED)
        if capped:  # a script without RLlib's flags: what `--num-env-runners 0` gives the others
            self.env_runners(num_env_runners=0)
        return build_algo(self, *args, **kwargs)

    AlgorithmConfig.build_algo = seeded_build_algo  # type: ignore[method-assign]

    train = Algorithm.train

    def recorded_train(self: Any) -> Any:
        result = train(self)
        extra: dict[str, Any] = {"algo": f"{type(self).__module__}.{type(self).__qualname__}"}
        runner = getattr(self, "env_runner", None)
        if runner is not None:
            extra["env_runner"] = type(runner).__qualname__
        if mode == "rllib_ext" and isinstance(self.config, rllib_ext_config()):
            from rllib_ext.runner_table import select_env_runner_class

            extra["rule"] = select_env_runner_class(self.config).rule
        state["iterations"].append(_iteration(result, extra))
        write()
        cap = int(os.environ.get(CAP_ENV) or 0)
        if cap and self.config.enable_rl_module_and_learner:
            state["trained"] = state.get("trained", 0) + 1
            if state["trained"] >= cap:  # a script's own loop (to a return): ended here
                write()
                raise SystemExit(0)
        return result

    Algorithm.train = recorded_train  # type: ignore[method-assign]

    tuner_init, tuner_fit = tune.Tuner.__init__, tune.Tuner.fit

    def seeded_init(self: Any, *args: Any, param_space: Any = None, **kwargs: Any) -> None:
        if isinstance(param_space, AlgorithmConfig) and param_space.seed is None:
            param_space.debugging(seed=SEED)
        elif isinstance(param_space, dict) and param_space.get("seed") is None:
            param_space["seed"] = SEED
        if capped:  # a script without RLlib's flags: its stop rule capped, no remote runners
            if isinstance(param_space, AlgorithmConfig):
                param_space.env_runners(num_env_runners=0)
            run_config = kwargs.get("run_config") or tune.RunConfig()
            run_config.stop = {"training_iteration": int(os.environ[CAP_ENV])}
            kwargs["run_config"] = run_config
        tuner_init(self, *args, param_space=param_space, **kwargs)

    def recorded_fit(self: Any) -> Any:
        grid = tuner_fit(self)
        for result in grid:
            frame = result.metrics_dataframe
            if frame is None or not len(frame):
                continue
            first = frame.iloc[0].to_dict()
            for row, metrics in ((first, None), (None, result.metrics)):
                if metrics is None:  # the first row, flattened by Tune: its episode stats
                    nested = {
                        "env_runners": {k: row.get(f"env_runners/{k}") for k in EPISODE_STATS}
                    }
                    state["iterations"].append({**_iteration(nested, {}), "keys": []})
                else:
                    state["iterations"].append(_iteration(metrics, {"tune": True}))
        write()
        return grid

    tune.Tuner.__init__ = seeded_init  # type: ignore[method-assign]
    tune.Tuner.fit = recorded_fit  # type: ignore[method-assign]

    shown = warnings.showwarning

    def recorded_warning(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
        if category.__name__ == "FusedSamplingFallback":
            state["fallbacks"].append(str(message))
            write()
        shown(message, category, *args, **kwargs)

    warnings.showwarning = recorded_warning

    class FallbackLog(logging.Handler):  # a fallback the user chose is an INFO line
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("fused sampling off"):
                state["fallbacks"].append(record.getMessage())
                write()

    fused_logger = logging.getLogger("rllib_ext")  # the fused loops log under it
    fused_logger.addHandler(FallbackLog(logging.INFO))
    fused_logger.setLevel(min(fused_logger.getEffectiveLevel(), logging.INFO))

    write()
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")


# --------------------------------------------------------------------------------------------
# In the harness's process.


@dataclass
class Run:
    """One run of one example in one mode."""

    mode: str
    returncode: int
    seconds: float
    iterations: list[dict[str, Any]] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.iterations)


def command(example: Example, mode: str, dump: Path, *, iters: int) -> list[str]:
    flags = ["--stop-iters", str(iters), "--num-env-runners", str(example.runners)]
    flags += ["--num-cpus", str(example.num_cpus)]
    if not example.tune:
        flags.append("--no-tune")
    if not example.script_flags:
        flags = []
    boot = "import sys; from tests.conformance.rllib_examples import bootstrap; bootstrap()"
    script = examples_dir() / example.path
    return [sys.executable, "-c", boot, mode, str(dump), str(script), *flags, *example.args]


def run_example(example: Example, mode: str, *, iters: int = 2, timeout: float = 600) -> Run:
    """``example`` in a fresh process with RLlib's PPO (``stock``) or ours (``rllib_ext``)."""
    with tempfile.TemporaryDirectory(prefix="rllib-conformance-") as tmp:
        dump = Path(tmp) / "dump.json"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            # The venv's commands (ray_serve_with_rllib starts `serve run`) without an activate.
            "PATH": os.pathsep.join(
                filter(None, [str(Path(sys.executable).parent), os.environ.get("PATH")])
            ),
            "RAY_DEDUP_LOGS": "0",
            "RAY_AIR_NEW_OUTPUT": "0",
            # Both runs hash strings alike: RLlib iterates sets of module / agent IDs, and with
            # Python's per-process hash seed the multi-agent examples' episodes differ between two
            # stock runs (multi_agent_cartpole: 130 vs 117 first-iteration episodes).
            "PYTHONHASHSEED": "0",
        }
        if not (example.script_flags or example.short):
            env[CAP_ENV] = str(iters)
        if example.num_cpus != 2:
            env["RAY_OVERRIDE_RESOURCES"] = json.dumps({"CPU": example.num_cpus})
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                command(example, mode, dump, iters=iters),
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            returncode, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            returncode = -9
            output = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {timeout} s"
            output = output if isinstance(output, str) else repr(output)
        seconds = time.perf_counter() - start
        state = json.loads(dump.read_text()) if dump.exists() else {}
    fallbacks = [f.removeprefix(FALLBACK_PREFIX) for f in state.get("fallbacks", [])]
    fallbacks = list(dict.fromkeys(fallbacks))
    for line in output.splitlines():  # a Tune trial's warnings reach us through its log
        match = FALLBACK.search(line)
        if match and match.group(1) not in fallbacks:
            fallbacks.append(match.group(1))
    return Run(
        mode,
        returncode,
        seconds,
        state.get("iterations", []),
        fallbacks,
        tail="\n".join(output.splitlines()[-60:]),
    )


@dataclass
class Row:
    """The comparison of one example's two runs."""

    example: str
    stock_ok: bool
    ext_ok: bool
    path: str
    missing_keys: list[str]
    unknown_keys: list[str]
    identical_first: bool | None
    """``None``: not compared (a run failed or reported no episodes)."""
    seconds: float
    note: str = ""
    """Why rllib_ext's (or stock's) run failed."""
    compared: str = ""
    """What the identical-first-iteration column compared, where not every statistic."""
    failed_alike: bool = False
    """Both runs trained, then failed the same way: their iterations were compared."""

    @property
    def conforms(self) -> bool:
        if not self.stock_ok:  # nothing to conform to beyond the iterations both ran
            return not (self.missing_keys or self.unknown_keys or self.identical_first is False)
        return (
            self.ext_ok
            and not self.missing_keys
            and not self.unknown_keys
            and self.identical_first is not False
        )


def our_path(ext: Run) -> str:
    """Which of our paths ran: fused, fallback (and why) or RLlib's runner (and the rule)."""
    fused = [it["fused_sampling"] for it in ext.iterations if it.get("fused_sampling") is not None]
    rules = {it["rule"] for it in ext.iterations if it.get("rule")}
    reasons = "; ".join(ext.fallbacks)
    if fused and all(fused):
        return "fused"
    if fused:
        return f"fallback: {reasons or 'fused_sampling metric 0'}"
    runner = next((it.get("env_runner") for it in ext.iterations if it.get("env_runner")), None)
    where = ", ".join(sorted(rules)) or "rule not recorded (Tune trial)"
    return f"RLlib's runner{f' {runner}' if runner else ''} ({where})"


PIECE_TIMERS = "learners/__all_modules__/learner_connector/timers/connectors/"
"""Where RLlib times each learner-connector piece, under the piece's name."""


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def replaced_piece_timers() -> dict[str, frozenset[str]]:
    """Our learner-connector piece's timer -> the timers of the RLlib pieces it replaces (README,
    "Vectorized GAE and batching"): a stock timer may be missing only where ours ran instead."""
    from ray.rllib.connectors.learner import GeneralAdvantageEstimation  # lazy: Ray

    from rllib_ext.connectors.batching import FUSED_PIECES

    return {
        "compiled_gae": frozenset({_snake(GeneralAdvantageEstimation.__name__)}),
        "vectorized_episodes_to_batch": frozenset(_snake(p.__name__) for p in FUSED_PIECES),
    }


def unexplained_missing(missing: Iterable[str], ext_keys: set[str]) -> list[str]:
    """``missing`` less the timers of RLlib pieces that one of ours replaced in this run."""
    replaced = {
        f"{PIECE_TIMERS}{stock}"
        for ours, stocks in replaced_piece_timers().items()
        if f"{PIECE_TIMERS}{ours}" in ext_keys
        for stock in stocks
    }
    return sorted(set(missing) - replaced)


def documented_extra(key: str) -> bool:
    """A result key rllib_ext documents as its own (its prefixes, its pieces' timers)."""
    ours = {f"{PIECE_TIMERS}{piece}" for piece in ("compiled_gae", "vectorized_episodes_to_batch")}
    return bool(OUR_KEY.search(key)) or key in ours


TIMING_KEYS = re.compile(r"^perf/")
"""Keys whose presence depends on wall time, not on the code: Tune's ``perf/*`` appear only where
its utilization monitor took a sample (every 0.7 s) during the iteration."""


def _last_keys(run: Run) -> set[str]:
    keyed = [it for it in run.iterations if it["keys"]]
    keys = keyed[-1]["keys"] if keyed else []
    return {k for k in keys if not TIMING_KEYS.search(k)}


def error_line(run: Run) -> str:
    """The last ``...Error: ...`` line of a failed run's output (else its last line)."""
    lines = run.tail.splitlines()
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    return (errors or lines or [f"exit {run.returncode}"])[-1][:300]


def compare(example: str, stock: Run, ext: Run, *, stats: tuple[str, ...] = EPISODE_STATS) -> Row:
    """Stock and rllib_ext runs of one example side by side (``stats``: the first iteration's
    episode statistics that must be equal)."""
    stock_keys, ext_keys = _last_keys(stock), _last_keys(ext)
    # Both trained, then failed the same way (a script's own step after training): their
    # iterations are still compared.
    alike = (
        not (stock.ok or ext.ok)
        and bool(stock.iterations and ext.iterations)
        and error_line(stock) == error_line(ext)
    )
    both = (stock.ok and ext.ok) or alike
    missing = unexplained_missing(stock_keys - ext_keys, ext_keys) if both else []
    unknown = sorted(k for k in ext_keys - stock_keys if not documented_extra(k)) if both else []
    identical: bool | None = None
    compared = ""
    if both:
        first_stock, first_ext = stock.iterations[0]["episodes"], ext.iterations[0]["episodes"]
        if first_stock.get("num_episodes"):
            identical = all(first_stock.get(k) == first_ext.get(k) for k in stats)
        else:
            compared = "no episode ended in the first iteration"
    note = ""
    if stock.ok and not ext.ok:
        note = error_line(ext)
    elif alike:
        note = f"both fail alike after training: {error_line(stock)}"
    elif not stock.ok:
        note = f"stock: {error_line(stock)}"
    return Row(
        example,
        stock.ok,
        ext.ok,
        our_path(ext) if both else "-",
        missing,
        unknown,
        identical,
        round(stock.seconds + ext.seconds, 1),
        note,
        compared,
        alike,
    )


def run_pair(example: Example, *, iters: int = 2, timeout: float = 600) -> tuple[Row, Run, Run]:
    stock = run_example(example, "stock", iters=iters, timeout=timeout)
    ext = run_example(example, "rllib_ext", iters=iters, timeout=timeout)
    row = compare(example.name, stock, ext, stats=example.stats)
    if example.unseeded and row.identical_first is not None:
        row.compared = example.unseeded
        if not example.stats:
            row.identical_first = None
    return row, stock, ext


def _mark(value: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[value]


def table(rows: Iterable[Row]) -> str:
    lines = [
        "| example | stock ok | rllib-ext ok | same result keys | our path | identical 1st iteration | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        keys = "yes" if not (row.missing_keys or row.unknown_keys) else "**no**"
        if row.missing_keys or row.unknown_keys:
            keys += f" (missing {row.missing_keys}, extra {row.unknown_keys})"
        if not (row.stock_ok and row.ext_ok or row.failed_alike):
            keys = "n/a"
        path = row.path + (f" ({row.note})" if row.note else "")
        lines.append(
            f"| `{row.example}` | {_mark(row.stock_ok)} | {_mark(row.ext_ok)} | {keys} | {path} "
            f"| {_mark(row.identical_first)}{f' ({row.compared})' if row.compared else ''} "
            f"| {row.seconds:.0f} |"
        )
    return "\n".join(lines)


def brief(run: Run) -> dict[str, Any]:
    """What the JSON keeps of a run: no key lists (the row holds the differences)."""
    iterations = [{k: v for k, v in it.items() if k != "keys"} for it in run.iterations]
    for it, full in zip(iterations, run.iterations, strict=True):
        it["num_keys"] = len(full["keys"])
    return {**asdict(run), "iterations": iterations, "tail": run.tail.splitlines()[-15:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="only the default-pytest subset")
    parser.add_argument(
        "--core", action="store_true", help="only `make conformance`'s set (CI's), not the rest"
    )
    parser.add_argument(
        "--iters", type=int, help="training iterations per run (default: each example's)"
    )
    parser.add_argument(
        "--only", nargs="*", help="example names (e.g. learners/ppo_with_custom_loss_fn)"
    )
    parser.add_argument("--json", type=Path, help="write the rows (and each run's tail) here")
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds a run may take (default: 600)"
    )
    args = parser.parse_args(argv)
    chosen = [
        e
        for e in EXAMPLES
        if (e.fast or not args.fast)
        and (e.fast or e.core or not args.core)
        and (not args.only or e.name in args.only)
    ]
    rows, records = [], []
    for example in chosen:
        row, stock, ext = run_pair(example, iters=args.iters or example.iters, timeout=args.timeout)
        rows.append(row)
        records.append({"row": asdict(row), "stock": brief(stock), "rllib_ext": brief(ext)})
        print(f"{example.name}: conforms={row.conforms} ({row.seconds:.0f} s)", flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(records, indent=1))
    print(table(rows))
    return 0 if all(row.conforms for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
