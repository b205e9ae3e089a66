"""SMAX results under one evaluation protocol: our runs at 1M / 2M / 3M env steps, JaxMARL beside.

The protocol (benchmarks/README.md, "SMAX results"):

* **Env steps** are joint env steps summed over all battles (one step of 64 battles is 64), as
  JaxMARL and Mava count them; RLlib's ``num_env_steps_sampled_lifetime`` counts the same.
* **Our win rates** at a mark (1M, 2M, 3M in the table; every 250k for the curves): the run's
  checkpoint nearest the mark (``rllib-ext train
  --checkpoint-freq 10``) plays ``--episodes`` fresh battles twice with ``rllib-ext evaluate``'s
  batched SMAX path: actions sampled from the policy (as in training, as Mava reports) and
  greedy (argmax). Battle ``i`` is reset with seed ``--eval-seed + i``; every action is checked
  against the legal-action mask. Wall time: the run's ``time_total_s`` at that checkpoint
  (training only: process start, Ray start and the evaluations are not in it).
* **JaxMARL's MAPPO** (``benchmarks/jaxmarl_reference.py``, same map, env options and budget):
  sampled win rate at a mark = the mean of its per-update training win rates over the
  ``--jaxmarl-updates`` updates that end at or before the mark (each update ends >= 128 battles
  with the upstream 128 envs: every battle ends within 100 steps), wall time of the last of
  them (XLA compilation included); at the end of the run also its final actor over fresh battles,
  sampled and greedy.

``evaluate`` writes one JSON-lines file per run (a ``{"header": ...}`` row first: command,
commit, machine, jaxmarl version, map, env options, preset, seed, the training command);
``table`` prints the markdown table of benchmarks/README.md from such files and JaxMARL's::

    flock /tmp/cpu.lock python benchmarks/smax_results.py evaluate RUN_DIR \\
        --train-command "rllib-ext train --preset smax-3s5z_vs_3s6z --seed 1 ..." \\
        --out benchmarks/results/smax_results/ours_3s5z_vs_3s6z_seed1.jsonl
    python benchmarks/smax_results.py table benchmarks/results/smax_results/*.jsonl
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import time
from collections import defaultdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

from run_header import append_rows, run_header

MARKS = (1_000_000, 2_000_000, 3_000_000)
"""The table's marks; ``evaluate`` also evaluates every 250k env steps for the curves."""
CURVE_MARKS = tuple(range(250_000, 3_000_001, 250_000))


def _progress(run_dir: Path) -> dict[int, dict[str, float]]:
    """``training_iteration`` -> env steps, training seconds, training win rate."""
    out = {}
    with (run_dir / "progress.csv").open() as f:
        for row in csv.DictReader(f):
            out[int(row["training_iteration"])] = {
                "env_steps": float(row["num_env_steps_sampled_lifetime"]),
                "wall_s": float(row["time_total_s"]),
                "train_win_rate": float(row.get("env_runners/rllib_ext/win_rate") or "nan"),
            }
    return out


def _nearest_checkpoint(run_dir: Path, progress: dict, mark: int) -> tuple[Path, int]:
    checkpoints = {
        int(m.group(1)): p
        for p in (run_dir / "checkpoints").iterdir()
        if (m := re.fullmatch(r"iter_(\d+)", p.name)) and int(m.group(1)) in progress
    }
    iteration = min(checkpoints, key=lambda i: abs(progress[i]["env_steps"] - mark))
    return checkpoints[iteration], iteration


def evaluate_run(args: argparse.Namespace) -> None:
    from rllib_ext.cli.evaluate import evaluate

    run_dir = args.run_dir
    settings = json.loads((run_dir / "settings.json").read_text())
    env_config = settings["env_config"]
    header = run_header(
        jaxmarl=version("jaxmarl"),
        map=env_config["map_name"],
        env_options=env_config.get("smax_options", {}),
        preset=settings.get("preset"),
        seed=settings.get("seed"),
        train_command=args.train_command,
        protocol=f"{args.episodes} fresh battles per policy, battle i seeded {args.eval_seed} + i",
    )
    progress = _progress(run_dir)
    rows: list[dict[str, Any]] = [{"header": header}]
    for mark in args.marks:
        checkpoint, iteration = _nearest_checkpoint(run_dir, progress, mark)
        row: dict[str, Any] = {
            "run": "rllib-ext",
            "map": env_config["map_name"],
            "seed": settings.get("seed"),
            "mark": mark,
            "iteration": iteration,
            "env_steps": int(progress[iteration]["env_steps"]),
            "wall_s": round(progress[iteration]["wall_s"], 1),
            "train_win_rate": round(progress[iteration]["train_win_rate"], 3),
        }
        for explore in (True, False):
            start = time.perf_counter()
            result = evaluate(
                checkpoint, episodes=args.episodes, explore=explore, seed=args.eval_seed
            )
            mode = "sampled" if explore else "greedy"
            row[f"{mode}_win_rate"] = round(float(result.win_rate or 0.0), 3)
            row[f"{mode}_eval_s"] = round(time.perf_counter() - start, 1)
            row["checked_actions"] = result.checked_actions
            row["battles_at_once"] = result.battles_at_once
        row["episodes"] = args.episodes
        print(json.dumps(row), flush=True)
        rows.append(row)
    append_rows(args.out, rows)


def _jaxmarl_rows(path: Path, updates: int, marks: tuple[int, ...]) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    seed = lines[0].get("header", {}).get("seed") if lines else None
    per_update = [r for r in lines if "train_win_rate" in r and "env_steps" in r]
    final = next((r for r in lines if "final_env_steps" in r), {})
    out = []
    for mark in marks:
        window = [r for r in per_update if r["env_steps"] <= mark][-updates:]
        if not window or window[-1]["env_steps"] < mark * 0.95:
            continue
        rate = sum(r["train_win_rate"] for r in window) / len(window)
        row = {"mark": mark, "seed": seed, "env_steps": window[-1]["env_steps"]}
        row |= {"wall_s": window[-1]["wall_s"], "sampled_win_rate": round(rate, 3)}
        if final and abs(final["final_env_steps"] - mark) < 0.05 * mark:
            row["final_sampled"] = final.get("sampled_eval_win_rate")
            row["final_greedy"] = final.get("greedy_eval_win_rate")
        out.append(row)
    return out


def _label(header: dict[str, Any]) -> str:
    """The preset a run trained with, plus its ``--training`` overrides where it had some (read
    from the training command in the header)."""
    label = header.get("preset") or "-"
    found = re.search(r"--training '([^']*)'", header.get("train_command", ""))
    return f"{label} + {found.group(1)}" if found else label


def _seeds(rows: list[dict], key: str) -> str:
    """``**median** (seed 0 / seed 1 / ...)``; one seed: its value."""
    listed = " / ".join(f"{r[key]:.3f}" for r in sorted(rows, key=lambda r: r["seed"]))
    median = statistics.median(r[key] for r in rows)
    return f"**{median:.3f}** ({listed})" if len(rows) > 1 else f"**{median:.3f}**"


def _versus(mine: list[dict], ref: list[dict]) -> str:
    """Our median sampled win rate against the range of JaxMARL's seeds: below, within, above."""
    if not mine or len(ref) < 2:
        return ""
    median = statistics.median(r["sampled_win_rate"] for r in mine)
    low = min(r["sampled_win_rate"] for r in ref)
    high = max(r["sampled_win_rate"] for r in ref)
    return "below" if median < low else "above" if median > high else "within"


def table(args: argparse.Namespace) -> None:
    """One markdown row per map, preset and mark: ours (median of seeds, each seed listed),
    JaxMARL's MAPPO (the same over its seeds) and where our median lies against the range of
    JaxMARL's seeds."""
    marks = tuple(args.marks)
    ours: dict[tuple[str, str], dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    theirs: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for path in args.files:
        first = json.loads(path.read_text().splitlines()[0]).get("header", {})
        if "jaxmarl_baseline" in first:
            for row in _jaxmarl_rows(path, args.jaxmarl_updates, marks):
                theirs[first["map"]][row["mark"]].append(row)
            continue
        for line in path.read_text().splitlines()[1:]:
            row = json.loads(line)
            if "mark" in row and row["mark"] in marks:  # evaluation rows
                ours[(row["map"], _label(first))][row["mark"]].append(row)

    print(
        "| map | preset | env steps | ours sampled (seeds) | ours greedy | our wall time | "
        "JaxMARL MAPPO sampled (seeds) | its wall time | ours vs JaxMARL's seeds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted(set(ours) | {(m, "-") for m in theirs if not any(k[0] == m for k in ours)})
    for map_name, preset in keys:
        for mark in marks:
            mine, ref = ours[(map_name, preset)][mark], theirs[map_name][mark]
            if not mine and not ref:
                continue
            ordered = sorted(mine, key=lambda r: r["seed"])
            walls = " / ".join(f"{r['wall_s'] / 60:.1f}" for r in ordered)
            ref_text, ref_wall = "not run", ""
            if ref:
                ref = sorted(ref, key=lambda r: r["seed"])
                ref_wall = " / ".join(f"{r['wall_s'] / 60:.1f}" for r in ref) + " min"
                ref_text = _seeds(ref, "sampled_win_rate")
                finals = [r for r in ref if "final_sampled" in r]
                if finals:
                    ref_text += " (final actor: " + ", ".join(
                        f"{r['final_sampled']:.3f} / {r['final_greedy']:.3f}" for r in finals
                    )
                    ref_text += " sampled / greedy)"
            print(
                f"| {map_name} | {preset} | {mark / 1e6:g}M | "
                f"{_seeds(mine, 'sampled_win_rate') if mine else 'not run'} | "
                f"{_seeds(mine, 'greedy_win_rate') if mine else 'not run'} | "
                f"{walls + ' min' if mine else ''} | {ref_text} | {ref_wall} | "
                f"{_versus(mine, ref)} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate", help="evaluate a run's checkpoints at the marks")
    ev.add_argument("run_dir", type=Path, help="an 'rllib-ext train' run directory")
    ev.add_argument("--marks", type=int, nargs="+", default=list(CURVE_MARKS))
    ev.add_argument("--episodes", type=int, default=200)
    ev.add_argument("--eval-seed", type=int, default=10_000)
    ev.add_argument("--train-command", required=True, help="the command that trained the run")
    ev.add_argument("--out", type=Path, required=True)
    tb = sub.add_parser("table", help="the README table from result files")
    tb.add_argument("files", type=Path, nargs="+")
    tb.add_argument("--jaxmarl-updates", type=int, default=2)
    tb.add_argument(
        "--marks", type=int, nargs="+", default=list(MARKS), help="env steps (default: 1M 2M 3M)"
    )
    args = parser.parse_args()
    evaluate_run(args) if args.command == "evaluate" else table(args)


if __name__ == "__main__":
    main()
