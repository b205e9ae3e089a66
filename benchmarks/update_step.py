"""One PPO learner update of ``ppo_throughput.py``'s CartPole settings, eager and compiled.

The measurement behind issue 39's "compiled update step where it pays": what one update costs
(80 minibatch steps: 2,000 rows, 10 epochs of 250-row minibatches, separate [256, 256] tanh actor
and critic, Adam 3e-4, gradient-norm clip 0.5), per variant and torch thread count, and what
compiling costs before it pays.

Variants, each in a fresh process (``--variants``):

* ``stock``: RLlib's ``PPOTorchLearner``;
* ``rllib-ext``: ``rllib_ext.PPOConfig``'s defaults;
* ``rllib-ext-compile_update``: the same with ``compile_update=True`` (the minibatch's forward
  and PPO loss as one graph, its backward with it; ``rllib_ext.learners.compiled_loss``);
* ``rllib-ext-compiled``: the same with RLlib's own whole-update compile
  (``.framework(torch_compile_learner=True,
  torch_compile_learner_what_to_compile="complete_update")``, inductor);
* ``bare-eager`` / ``bare-compiled``: the same update in plain torch (LeanRL's shape: one
  function of loss, backward, global-norm clip and Adam step per minibatch; the compiled one is
  that function under ``torch.compile``, Adam ``capturable`` with the learning rate as a tensor,
  so no minibatch recompiles). Their rows also carry ``max_abs_diff``: the largest parameter
  difference between the eager and the compiled step after one update from the same start.

RLlib rows time ``algo.learner_group.update(episodes=...)`` on one fixed sampled batch, a fresh
copy per update (the learner connector, GAE included, is part of the update; its lr schedule,
metrics and minibatch iterator are RLlib's; ``rows``: the env steps plus the one bootstrap row per
episode chunk that RLlib's connector appends, so RLlib rows run ``ceil(rows * 10 / 250)`` minibatch
steps where the bare rows run 80). Per row: ``first_s`` (the first timed update: compilation included for
the bare rows; RLlib compiles from the second minibatch of its warm-up ``train()`` on),
``median_s`` / ``min_s`` over ``--updates`` further updates, ``graphs`` and ``graph_breaks``
(torch._dynamo's counters; 0 for eager), ``threads`` (``torch.get_num_threads()`` in force).

Command (2-core machine; run alone, under the lock)::

    flock /tmp/cpu.lock .venv/bin/python benchmarks/update_step.py \\
        --json benchmarks/results/update_step/update_step.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ppo_throughput import BATCH, EPOCHS, MINIBATCH, PPO, _rllib_config
from run_header import append_rows, run_header

VARIANTS = (
    "stock",
    "rllib-ext",
    "rllib-ext-compile_update",
    "rllib-ext-compiled",
    "bare-eager",
    "bare-compiled",
)
HIDDEN, OBS, ACTIONS = 256, 4, 2


def _dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def _timed(update: Any, updates: int) -> dict[str, Any]:
    start = time.perf_counter()
    update()
    first = time.perf_counter() - start
    times = []
    for _ in range(updates):
        start = time.perf_counter()
        update()
        times.append(time.perf_counter() - start)
    return dict(first_s=first, median_s=statistics.median(times), min_s=min(times))


def rllib_update(variant: str, updates: int, threads: int) -> dict[str, Any]:
    """``learner_group.update`` on one sampled CartPole batch (see the module docstring), with
    ``threads`` torch threads (rllib-ext: its ``cpu_threads``, so "auto" does not pick)."""
    config = _rllib_config("stock" if variant == "stock" else "rllib-ext", "CartPole-v1", seed=0)
    if variant != "stock":
        config.training(cpu_threads=threads)
    if variant == "rllib-ext-compile_update":
        config.training(compile_update=True)
    if variant == "rllib-ext-compiled":
        config.framework(
            torch_compile_learner=True,
            torch_compile_learner_what_to_compile="complete_update",
            torch_compile_learner_dynamo_backend="inductor",
        )
    algo = config.build_algo()
    try:
        algo.train()  # RLlib updates uncompiled once after build (TorchLearner._update)
        episodes = algo.env_runner.sample(num_timesteps=BATCH)
        # The learner connector appends a bootstrap step to each episode in place: every update
        # gets its own copy (made before the clock starts), so each trains on the same rows.
        copies = [copy.deepcopy(episodes) for _ in range(updates + 1)]

        def update() -> None:
            algo.learner_group.update(
                episodes=copies.pop(),
                timesteps={},
                num_epochs=EPOCHS,
                minibatch_size=MINIBATCH,
                shuffle_batch_per_epoch=True,
            )

        # Rows per update: the env steps plus one bootstrap row per episode chunk.
        rows = sum(len(e) for e in episodes) + len(episodes)
        return {**_timed(update, updates), **_dynamo_counts(), "rows": rows}
    finally:
        algo.stop()


def _bare_parts(seed: int) -> tuple[Any, Any, dict[str, Any]]:
    import torch
    from torch import nn

    torch.manual_seed(seed)

    def mlp(out: int) -> nn.Module:
        return nn.Sequential(
            nn.Linear(OBS, HIDDEN),
            nn.Tanh(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.Tanh(),
            nn.Linear(HIDDEN, out),
        )

    nets = nn.ModuleDict({"pi": mlp(ACTIONS), "vf": mlp(1)})
    data = {
        "obs": torch.randn(BATCH, OBS),
        "actions": torch.randint(0, ACTIONS, (BATCH,)),
        "logp": torch.full((BATCH,), -0.69),
        "advantages": torch.randn(BATCH),
        "targets": torch.randn(BATCH),
        "values": torch.randn(BATCH),
    }
    return nets, torch, data


def _bare_step_fn(nets: Any, torch: Any, compiled: bool) -> Any:
    """One minibatch step of ``nets`` with its own Adam (compiled: under ``torch.compile``)."""
    params = list(nets.parameters())
    if compiled:
        optim = torch.optim.Adam(params, lr=torch.tensor(PPO["lr"]), capturable=True)
    else:
        optim = torch.optim.Adam(params, lr=PPO["lr"], fused=True)

    def step(obs, actions, logp_old, adv, targets, values):  # noqa: ANN001, ANN202
        logits = nets["pi"](obs)
        logp = torch.distributions.Categorical(logits=logits).log_prob(actions)
        ratio = torch.exp(logp - logp_old)
        clip = PPO["clip"]
        surrogate = torch.min(adv * ratio, adv * torch.clamp(ratio, 1 - clip, 1 + clip))
        value = nets["vf"](obs).squeeze(-1)
        vf_loss = torch.clamp((value - targets) ** 2, 0, 10.0)
        loss = -surrogate.mean() + PPO["vf_coeff"] * vf_loss.mean()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, PPO["max_grad_norm"], foreach=True)
        optim.step()
        return loss.detach()

    return torch.compile(step) if compiled else step


COLUMNS = ("obs", "actions", "logp", "advantages", "targets", "values")


def _one_update(step: Any, torch: Any, data: dict[str, Any], generator: Any) -> None:
    """``EPOCHS`` shuffled passes of ``MINIBATCH``-row steps over ``data`` (80 steps)."""
    for _ in range(EPOCHS):
        order = torch.randperm(BATCH, generator=generator)
        for begin in range(0, BATCH, MINIBATCH):
            rows = order[begin : begin + MINIBATCH]
            step(*(data[k][rows] for k in COLUMNS))


def bare_update(variant: str, updates: int) -> dict[str, Any]:
    """The plain-torch update (see the module docstring), 80 minibatch steps per update."""
    compiled = variant == "bare-compiled"
    nets, torch, data = _bare_parts(seed=0)
    step = _bare_step_fn(nets, torch, compiled)
    generator = torch.Generator().manual_seed(0)
    row = {**_timed(lambda: _one_update(step, torch, data, generator), updates), **_dynamo_counts()}
    if compiled:
        row["max_abs_diff"] = _eager_vs_compiled()
    return row


def _eager_vs_compiled() -> float:
    """Largest parameter difference after one update (80 steps) from the same start and rows."""
    results = []
    for compiled in (False, True):
        nets, torch, data = _bare_parts(seed=1)
        step = _bare_step_fn(nets, torch, compiled)
        _one_update(step, torch, data, torch.Generator().manual_seed(1))
        results.append([p.detach().clone() for p in nets.parameters()])
    return max(float((a - b).abs().max()) for a, b in zip(*results, strict=True))


def _worker(task: dict[str, Any]) -> dict[str, Any]:
    import torch

    if task["variant"].startswith("rllib-ext"):
        import rllib_ext  # noqa: F401
    if task["variant"].startswith("bare"):
        torch.set_num_threads(task["threads"])
        return {**bare_update(task["variant"], task["updates"]), "threads": torch.get_num_threads()}
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        # The learner is local (num_learners=0): this process's torch threads are its threads.
        torch.set_num_threads(task["threads"])
        row = rllib_update(task["variant"], task["updates"], task["threads"])
        return {**row, "threads": torch.get_num_threads()}
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--updates", type=int, default=10, help="timed updates after the first")
    parser.add_argument("--json", type=Path, help="append rows to this JSON-lines file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))), flush=True)
        return
    import torch

    settings = dict(batch=BATCH, epochs=EPOCHS, minibatch=MINIBATCH, hidden=[HIDDEN, HIDDEN], **PPO)
    rows: list[dict[str, Any]] = [
        {"header": run_header(versions={"torch": torch.__version__}, settings=settings)}
    ]
    print(json.dumps(rows[0]), flush=True)
    for threads in args.threads:
        for variant in args.variants:
            task = {"variant": variant, "threads": threads, "updates": args.updates}
            out = subprocess.run(
                [sys.executable, __file__, "--worker", json.dumps(task)],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                row = {**task, "error": (out.stderr or out.stdout)[-2000:]}
            else:
                row = {**task, **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        append_rows(args.json, rows)


if __name__ == "__main__":
    main()
