"""Learner connector time for a stateful SMAX module: rllib_ext's fused batching vs RLlib's pieces.

Builds the algorithm ``rllib-ext train`` would build for a preset (default: ``smax-jaxmarl-mappo``
on 3s5z_vs_3s6z, a recurrent actor and critic, 32-step sequences), samples one train batch with
its env runner, then runs the learner's own connector pipeline on deep copies of those episodes,
alternating two learners that differ only in ``batching`` (``"vectorized"`` / ``"rllib"``):
the whole pipeline (batching, the critic's values and GAE, value targets, to tensors) and, apart,
the batching pieces alone. The two batches are checked equal (every column, bit for bit) before
any timing. One JSON line per variant (median and all repeats, seconds) with the run header.

    python benchmarks/sequence_batching.py --repeats 5 --json out.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch
import tree

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_header import append_rows, run_header  # noqa: E402


def _settings(command: str, batching: str) -> Any:
    from rllib_ext.cli.main import _build_parser, _option_values
    from rllib_ext.cli.runconfig import resolve_settings

    args = _build_parser().parse_args(shlex.split(command))
    set_values = [*(args.set_values or []), f"batching={batching}"]
    return resolve_settings(_option_values(args), set_values=set_values, preset=args.preset)


def _algo(command: str, batching: str) -> Any:
    from rllib_ext.cli.ppo_config import build_algo_config

    config = build_algo_config(_settings(command, batching))
    return config.build_algo()


def _run(pipeline: Any, module: Any, episodes: list, pieces: int | None = None) -> tuple:
    episodes = copy.deepcopy(episodes)
    connectors = pipeline.connectors
    if pieces is not None:
        pipeline.connectors = connectors[:pieces]
    try:
        shared: dict = {}
        started = time.perf_counter()
        batch = pipeline(rl_module=module, batch={}, episodes=episodes, shared_data=shared)
        return time.perf_counter() - started, batch
    finally:
        pipeline.connectors = connectors


def _batching_pieces(pipeline: Any) -> int:
    """How many leading pieces turn episodes into the batch (up to BatchIndividualItems, or
    the fused piece)."""
    from ray.rllib.connectors.common import BatchIndividualItems

    from rllib_ext.connectors.batching import VectorizedEpisodesToBatch

    for i, piece in enumerate(pipeline.connectors):
        if isinstance(piece, (BatchIndividualItems, VectorizedEpisodesToBatch)):
            return i + 1
    raise SystemExit(f"no batching piece in {[type(p).__name__ for p in pipeline.connectors]}")


def _assert_equal(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for mid in a:
        assert list(a[mid]) == list(b[mid]), (mid, list(a[mid]), list(b[mid]))
        for column in a[mid]:
            for x, y in zip(
                tree.flatten(a[mid][column]), tree.flatten(b[mid][column]), strict=True
            ):
                x, y = torch.as_tensor(x), torch.as_tensor(y)
                assert x.dtype == y.dtype and x.shape == y.shape, column
                assert torch.equal(x, y), column


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--command",
        default="train --preset smax-jaxmarl-mappo --env-config "
        '\'{"map_name": "3s5z_vs_3s6z"}\' --seed 0',
        help="the rllib-ext command whose algorithm to build (its arguments after rllib-ext)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="append the JSON lines here")
    args = parser.parse_args(argv)

    algos = {name: _algo(args.command, name) for name in ("vectorized", "rllib")}
    try:
        runner = algos["vectorized"].env_runner
        batch_size = algos["vectorized"].config.train_batch_size_per_learner
        started = time.perf_counter()
        episodes = runner.sample(num_timesteps=batch_size, random_actions=False)
        sample_s = time.perf_counter() - started
        learners = {name: algo.learner_group._learner for name, algo in algos.items()}
        module = learners["vectorized"].module
        pipelines = {name: learner._learner_connector for name, learner in learners.items()}
        batches = {name: _run(p, module, episodes)[1] for name, p in pipelines.items()}
        _assert_equal(batches["vectorized"], batches["rllib"])
        times: dict[str, dict[str, list[float]]] = {n: {"whole": [], "batching": []} for n in algos}
        for _ in range(args.repeats):
            for name, pipeline in pipelines.items():
                times[name]["whole"].append(_run(pipeline, module, episodes)[0])
                pieces = _batching_pieces(pipeline)
                times[name]["batching"].append(_run(pipeline, module, episodes, pieces)[0])
    finally:
        for algo in algos.values():
            algo.stop()
    header = run_header(ray=ray.__version__, torch=torch.__version__)
    rows = []
    for name, parts in times.items():
        row = {
            "batching": name,
            "command": args.command,
            "env_steps": sum(len(e) for e in episodes),
            "sample_s": round(sample_s, 3),
            **{f"{part}_median_s": round(statistics.median(v), 4) for part, v in parts.items()},
            **{f"{part}_s": [round(x, 4) for x in v] for part, v in parts.items()},
        }
        rows.append(row)
        print(json.dumps(row))
    ratio = rows[1]["batching_median_s"] / rows[0]["batching_median_s"]
    whole = rows[1]["whole_median_s"] / rows[0]["whole_median_s"]
    print(f"batching pieces: vectorized {ratio:.2f}x RLlib's; whole pipeline {whole:.2f}x")
    if args.json:
        append_rows(args.json, [{"header": header}, *rows])


if __name__ == "__main__":
    main()
