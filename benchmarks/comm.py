"""Gradient-compression benchmark: bytes, codec time and step time of each DDP comm hook.

Two gloo ranks (no Ray) train PPO-shaped MLPs (separate policy and value encoders, as RLlib's
default PPO module) of three sizes with each compressor registered on a real DDP model:

* ``allreduce``: DDP's built-in fp32 all-reduce (the baseline; no hook),
* ``fp16``, ``bf16`` (``auto`` transport) and ``bf16-ag`` (the all-gather emulation used where
  gloo has no bf16), ``powersgd`` (rank 4, error feedback, warm start), ``onebit``.

Networks: ``loopback`` (both ranks in this network namespace) and, where the machine allows
network namespaces, ``1gbit`` / ``10gbit``: each rank in its own namespace, joined by a veth
pair shaped with ``tc tbf`` on both ends, gloo bound to the veth. The namespaces are created
and removed by this script (cleanup in ``finally``); only addresses inside them are used.
Needs root and iproute2 (``apt-get install -y iproute2``); otherwise those networks are
skipped with a message.

Reported per model and compressor:

* ``bytes/step``: bytes one rank sends per step as on the wire (ring model, from the hooks'
  statistics) and, in namespaces, the veth's measured ``tx_bytes`` (includes TCP/IP headers);
* ``codec ms``: compress + decompress arithmetic of the hook on one rank without
  communication (``rllib_ext.ops`` on the model's gradient shapes, one rank at a time);
* ``step ms``: forward + backward + gradient exchange (median over steps, max over ranks);
  ``exchange ms`` = step minus the same step under DDP's ``no_sync()`` (no exchange; steps
  interleaved with the synced ones so drifting machine load cancels out; median over the DDP
  instances of a model). DDP overlaps the plain all-reduce with the backward pass, so
  exchange ms can be below bytes / bandwidth;
* ratios against ``allreduce``, and a break-even bandwidth from the 1 and 10 Gbit/s runs
  (exchange time fitted as ``a + b / bandwidth``; the compressor is faster below it).

Run from the repository root (two CPU-heavy processes; on a shared box serialise with flock):

    flock /tmp/cpu.lock .venv/bin/python benchmarks/comm.py --json /tmp/comm.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from rllib_ext.distributed import BF16State, bf16_hook
from rllib_ext.distributed.stats import allreduce_wire_bytes
from rllib_ext.learners.comm import make_comm_hook
from rllib_ext.ops.codecs import cast, onebit, powersgd, select_kernels
from rllib_ext.settings import CompressionSettings

MODELS = {
    # name: (observation size, hidden layers), two encoders (pi, vf) + heads (2 actions, 1 value)
    "ppo_default": (4, [256, 256]),
    "2M": (16, [1024, 1024]),
    "25M": (64, [2500, 2500, 2500]),
}
COMPRESSORS = ["allreduce", "fp16", "bf16", "bf16-ag", "powersgd", "onebit"]
NETWORKS = {"loopback": None, "1gbit": "1gbit", "10gbit": "10gbit"}
POWERSGD_RANK = 4
SUBNET = "10.213.7"


class PPOShapedMLP(nn.Module):
    """RLlib's default PPO module shape: separate pi / vf MLP encoders (tanh) and linear heads."""

    def __init__(self, obs_dim: int, hiddens: list[int], num_actions: int = 2) -> None:
        super().__init__()

        def encoder() -> nn.Sequential:
            layers: list[nn.Module] = []
            width = obs_dim
            for hidden in hiddens:
                layers += [nn.Linear(width, hidden), nn.Tanh()]
                width = hidden
            return nn.Sequential(*layers)

        self.pi_encoder, self.vf_encoder = encoder(), encoder()
        self.pi_head = nn.Linear(hiddens[-1], num_actions)
        self.vf_head = nn.Linear(hiddens[-1], 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        logits = self.pi_head(self.pi_encoder(obs))
        value = self.vf_head(self.vf_encoder(obs))
        return logits.pow(2).mean() + value.pow(2).mean()


def build_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    obs_dim, hiddens = MODELS[name]
    return PPOShapedMLP(obs_dim, hiddens)


# ------------------------------------------------------------------------------ worker side


def _tx_bytes(ifname: str | None) -> int | None:
    if ifname is None:
        return None
    with open(f"/sys/class/net/{ifname}/statistics/tx_bytes") as handle:
        return int(handle.read())


def _step(model: nn.Module, obs: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(obs).backward()


def _time_interleaved(ddp: nn.Module, obs: torch.Tensor, steps: int) -> tuple[float, float]:
    """Median seconds of a synced step and of the same step under ``no_sync`` (no exchange).

    Alternating the two in the same DDP instance makes their difference, the exposed cost of
    the gradient exchange, robust to drifting load on a shared machine.
    """
    synced, local = [], []
    for _ in range(steps):
        with ddp.no_sync():
            start = time.perf_counter()
            _step(ddp, obs)
            local.append(time.perf_counter() - start)
        dist.barrier()  # both ranks start the synced step together
        start = time.perf_counter()
        _step(ddp, obs)
        synced.append(time.perf_counter() - start)
    return float(np.median(synced)), float(np.median(local))


def _median_ms(fn, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def codec_ms(model: nn.Module, world_size: int) -> dict[str, float]:
    """Compress + decompress arithmetic per step, one rank, no communication: the codec
    functions the hooks call (``rllib_ext.ops.codecs``), with the kernels the hooks select."""
    numel = sum(p.numel() for p in model.parameters())
    grads = torch.randn(numel)
    out = torch.empty(numel)

    def cast_to(dtype: torch.dtype) -> None:
        out.copy_(cast.cast_compress(grads, dtype, divisor=world_size))

    def bf16_allgather() -> None:
        gathered = cast.bf16_bytes(grads).repeat(world_size)  # stands in for the all-gather
        cast.bf16_mean_of_bytes(gathered, world_size, out=out)

    residual = torch.zeros(numel)
    rms = grads.abs() + 1e-3
    scratch = torch.empty(numel)
    kernels = select_kernels("auto", grads)

    def onebit_step() -> None:
        # As the hook after warm-up: compress g / rms with error feedback, decode times rms.
        payload = onebit.encode(
            grads, residual=residual, precond=rms, kernels=kernels, scratch=scratch
        )
        payloads = payload.repeat(world_size, 1)  # stands in for the all-gather
        onebit.decode_mean(payloads, precond=rms, out=out, kernels=kernels)

    matrices, offset = [], 0
    error = torch.zeros(numel)
    for param in model.parameters():
        rows = param.shape[0]
        cols = param.numel() // rows
        if powersgd.should_compress(rows, cols, POWERSGD_RANK, 2):
            rank = min(rows, cols, POWERSGD_RANK)
            view = grads[offset : offset + param.numel()].view(rows, cols)
            err = error[offset : offset + param.numel()].view(rows, cols)
            matrices.append((view, torch.randn(rank, cols), torch.empty(rows, rank), err))
        offset += param.numel()

    def powersgd_step() -> None:
        # As the hook: error feedback and P = M Q, orthogonalise, Q^T = P^T M, decode + error.
        for matrix, qt, p, err in matrices:
            powersgd.orthogonalize_(qt.T, epsilon=1e-8)
            powersgd.add_error_and_p(matrix, qt, p, error=err, kernels=kernels)
            powersgd.compute_qt(matrix, p, qt, epsilon=1e-8)
        for matrix, qt, p, err in matrices:
            powersgd.decode_with_error(matrix, p, qt, error=err, kernels=kernels)

    return {
        "allreduce": 0.0,
        "fp16": _median_ms(lambda: cast_to(torch.float16)),
        "bf16": _median_ms(lambda: cast_to(torch.bfloat16)),
        "bf16-ag": _median_ms(bf16_allgather),
        "powersgd": _median_ms(powersgd_step),
        "onebit": _median_ms(onebit_step),
    }


def run_worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master_addr}:{args.port}",
        rank=args.rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=600),
    )
    world_size = dist.get_world_size()
    results: dict[str, Any] = {}
    for model_name in args.models:
        base = build_model(model_name)
        numel = sum(p.numel() for p in base.parameters())
        torch.manual_seed(100 + args.rank)
        obs = torch.randn(args.batch, MODELS[model_name][0])
        per_model: dict[str, Any] = {"params": numel}
        for name in args.compressors:
            model = copy.deepcopy(base)
            ddp = nn.parallel.DistributedDataParallel(model)
            state = None
            if name == "bf16-ag":
                state = BF16State(
                    CompressionSettings(grad_compression="bf16"), transport="allgather"
                )
                ddp.register_comm_hook(state, bf16_hook)
            elif name != "allreduce":
                # PowerSGD and 1-bit warm up with plain steps (as in the learner); the timed
                # steps come after --warmup >= 3 steps, so they are compressed.
                hook, state = make_comm_hook(
                    CompressionSettings(
                        grad_compression=name,
                        powersgd_rank=POWERSGD_RANK,
                        powersgd_start_iter=2,
                        onebit_warmup_steps=2,
                    )
                )
                ddp.register_comm_hook(state, hook)
            for _ in range(args.warmup):  # PowerSGD compresses from step 2 on
                _step(ddp, obs)
            if state is not None:
                state.pop_stats()
            dist.barrier()
            tx_before = _tx_bytes(args.ifname)
            step_s, local_s = _time_interleaved(ddp, obs, args.steps)
            tx_after = _tx_bytes(args.ifname)
            if state is None:
                bytes_sent = allreduce_wire_bytes(numel * 4, world_size)
                comm_s = float("nan")
            else:
                stats = state.pop_stats()
                bytes_sent = stats["bytes_sent"] / args.steps
                comm_s = stats["comm_time_s"] / args.steps
            per_model[name] = {
                "step_ms": step_s * 1e3,
                "local_ms": local_s * 1e3,
                "bytes": bytes_sent,
                "tx_bytes": None if tx_before is None else (tx_after - tx_before) / args.steps,
                "hook_comm_ms": comm_s * 1e3,
            }
            del ddp, model
        # Codec arithmetic: one rank at a time, so the two do not compete for memory bandwidth.
        for rank in range(world_size):
            if rank == args.rank:
                codec = codec_ms(base, world_size)
            dist.barrier()
        for name in args.compressors:
            per_model[name]["codec_ms"] = codec[name]
        results[model_name] = per_model
        dist.barrier()
    everyone: list[Any] = [None, None]
    dist.all_gather_object(everyone, results)
    if args.rank == 0:
        merged = everyone[0]
        for model_name, per_model in merged.items():
            other = everyone[1][model_name]
            for name in args.compressors:
                for key in ("step_ms", "local_ms"):
                    per_model[name][key] = max(per_model[name][key], other[name][key])
                if per_model[name]["tx_bytes"] is not None:
                    both = (per_model[name]["tx_bytes"], other[name]["tx_bytes"])
                    per_model[name]["tx_bytes"] = sum(both) / 2
        with open(args.out, "w") as handle:
            json.dump(merged, handle)
    dist.destroy_process_group()


# ------------------------------------------------------------------------ orchestrator side


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _netns_unavailable() -> str | None:
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (install iproute2: apt-get install -y iproute2)"
    probe = f"rxcprobe{os.getpid()}"
    try:
        _sh("ip", "netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        return f"cannot create network namespaces ({detail.strip()})"
    _sh("ip", "netns", "del", probe)
    return None


class VethPair:
    """Two network namespaces joined by a rate-limited veth pair; removed by ``close()``."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.namespaces = [f"rxcomm{tag}a", f"rxcomm{tag}b"]
        self.ifnames = [f"rxc{tag}a", f"rxc{tag}b"]
        self.addresses = [f"{SUBNET}.1", f"{SUBNET}.2"]
        self.created: list[str] = []

    def open(self) -> None:
        for ns in self.namespaces:
            _sh("ip", "netns", "add", ns)
            self.created.append(ns)
        ns_a, ns_b = self.namespaces
        if_a, if_b = self.ifnames
        _sh(
            "ip",
            "link",
            "add",
            if_a,
            "netns",
            ns_a,
            "type",
            "veth",
            "peer",
            "name",
            if_b,
            "netns",
            ns_b,
        )
        for ns, ifname, address in zip(self.namespaces, self.ifnames, self.addresses, strict=True):
            _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", ifname)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "link", "set", ifname, "up")

    def shape(self, rate: str) -> None:
        # burst ~ 2 ms at the rate (>= one 64 KiB GSO segment), queue up to 100 ms.
        burst = {"1gbit": "256kb", "10gbit": "2500kb"}[rate]
        for ns, ifname in zip(self.namespaces, self.ifnames, strict=True):
            _sh(
                "tc",
                "-n",
                ns,
                "qdisc",
                "replace",
                "dev",
                ifname,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                burst,
                "latency",
                "100ms",
            )

    def close(self) -> None:
        for ns in self.created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created.clear()


def launch(args: argparse.Namespace, network: str, veth: VethPair | None, out: str) -> dict:
    port = _free_port() if veth is None else 29_500 + os.getpid() % 1000
    procs = []
    for rank in range(2):
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--rank",
            str(rank),
            "--port",
            str(port),
            "--out",
            out,
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--batch",
            str(args.batch),
            "--models",
            *args.models,
            "--compressors",
            *args.compressors,
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if veth is None:
            cmd += ["--master-addr", "127.0.0.1"]
            env["GLOO_SOCKET_IFNAME"] = "lo"
        else:
            cmd += ["--master-addr", veth.addresses[0], "--ifname", veth.ifnames[rank]]
            env["GLOO_SOCKET_IFNAME"] = veth.ifnames[rank]
            cmd = ["ip", "netns", "exec", veth.namespaces[rank], *cmd]
        procs.append(subprocess.Popen(cmd, env=env))
    try:
        for proc in procs:
            if proc.wait(timeout=args.timeout) != 0:
                raise RuntimeError(f"{network}: a rank exited with {proc.returncode}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    with open(out) as handle:
        return json.load(handle)


def break_even_gbit(slow: dict, fast: dict, name: str) -> str:
    """Bandwidth below which ``name`` beats allreduce, from step times at 1 and 10 Gbit/s."""
    inv = (1 / 1.0, 1 / 10.0)  # 1/Gbit/s

    def fit(entry_1: dict, entry_10: dict) -> tuple[float, float]:
        # Exchange time (step minus local step) = a + b / bandwidth through the two points.
        y1 = entry_1["step_ms"] - _compute_ms(slow)
        y10 = entry_10["step_ms"] - _compute_ms(fast)
        slope = (y1 - y10) / (inv[0] - inv[1])
        return y1 - slope * inv[0], slope

    a0, b0 = fit(slow["allreduce"], fast["allreduce"])
    a, b = fit(slow[name], fast[name])
    if b >= b0:
        return "never" if a >= a0 else "above (faster at high bandwidth only)"
    if a <= a0:
        return "always"
    return f"{(b0 - b) / (a - a0):.1f} Gbit/s"


def _compute_ms(per_model: dict) -> float:
    """Forward + backward without exchange: median over the DDP instances of one model.

    Every instance runs the same no_sync step; the median keeps one slow instance (we see the
    hook-less DDP instance's no_sync step ~20 % slower, cause unknown) from biasing its row.
    """
    return float(np.median([v["local_ms"] for v in per_model.values() if isinstance(v, dict)]))


def tables(results: dict[str, dict]) -> str:
    lines = []
    for network, per_network in results.items():
        for model_name, per_model in per_network.items():
            base = per_model["allreduce"]
            compute = _compute_ms(per_model)
            base_sync = base["step_ms"] - compute
            lines += [
                f"\n**{network}, {model_name}** ({per_model['params']:,} params, "
                f"fwd+bwd without exchange {compute:.1f} ms)\n",
                "| compressor | bytes/step (model) | tx bytes/step (veth) | bytes ratio | "
                "codec ms | step ms | step ratio | exchange ms | exchange ratio |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for name in [n for n in COMPRESSORS if n in per_model]:
                entry = per_model[name]
                sync = entry["step_ms"] - compute
                tx = "n/a" if entry["tx_bytes"] is None else f"{entry['tx_bytes']:,.0f}"
                sync_ratio = f"{base_sync / sync:.2f}x" if sync > 0.5 else "n/a"
                lines.append(
                    f"| {name} | {entry['bytes']:,.0f} | {tx} | {base['bytes'] / entry['bytes']:.1f}x"
                    f" | {entry['codec_ms']:.1f} | {entry['step_ms']:.1f} | "
                    f"{base['step_ms'] / entry['step_ms']:.2f}x | {sync:.1f} | {sync_ratio} |"
                )
    if "1gbit" in results and "10gbit" in results:
        lines += ["\n**Break-even bandwidth** (compressor faster below it)\n"]
        lines += ["| model | " + " | ".join(COMPRESSORS[1:]) + " |"]
        lines += ["|---|" + "---|" * (len(COMPRESSORS) - 1)]
        for model_name in results["1gbit"]:
            slow, fast = results["1gbit"][model_name], results["10gbit"][model_name]
            cells = [break_even_gbit(slow, fast, name) for name in COMPRESSORS[1:]]
            lines.append(f"| {model_name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if "model name" in line)
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__}, gloo, 2 ranks x 1 thread"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument(
        "--compressors", nargs="+", default=COMPRESSORS, choices=COMPRESSORS, help=argparse.SUPPRESS
    )
    parser.add_argument("--steps", type=int, default=7, help="timed step pairs per compressor")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (>= 3 for PowerSGD)")
    parser.add_argument("--batch", type=int, default=64, help="observations per step and rank")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", help="also write the raw results here")
    # Worker-only arguments.
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--master-addr", help=argparse.SUPPRESS)
    parser.add_argument("--ifname", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
        return

    print(machine_line())
    results: dict[str, dict] = {}
    scratch = f"/tmp/rllib_ext_comm_{os.getpid()}"
    os.makedirs(scratch, exist_ok=True)
    shaped = [n for n in args.networks if NETWORKS[n] is not None]
    if "loopback" in args.networks:
        print("running loopback ...", flush=True)
        results["loopback"] = launch(args, "loopback", None, f"{scratch}/loopback.json")
    if shaped:
        reason = _netns_unavailable()
        if reason is not None:
            print(f"SKIPPED rate-limited networks {shaped}: {reason}")
        else:
            veth = VethPair()
            try:
                veth.open()
                for network in shaped:
                    print(f"running {network} (veth + tc tbf) ...", flush=True)
                    veth.shape(NETWORKS[network])
                    results[network] = launch(args, network, veth, f"{scratch}/{network}.json")
            finally:
                veth.close()
    print(tables(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": machine_line(), "results": results}, handle, indent=1)


if __name__ == "__main__":
    main()
