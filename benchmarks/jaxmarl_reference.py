"""JaxMARL's own MAPPO on SMAX, run unchanged, as the reference for our SMAX learning rows.

What it runs: ``baselines/MAPPO/mappo_rnn_smax.py`` and its config
``baselines/MAPPO/config/mappo_homogenous_rnn_smax.yaml`` from a JaxMARL checkout (measured at
commit c793d09; nothing of it is copied here). Only the map, the step budget, the seed and
(optionally) the number of envs are overridden. The script imports the upstream module with
stand-ins for what ``make_train`` never calls or only logs through:

* ``wandb``: its ``log`` writes each update's metrics as one JSON line instead;
* ``hydra`` / ``omegaconf``: only ``main()`` uses them (not called here);
* ``distrax.Categorical``: the one distribution the script uses (``sample``, ``log_prob``,
  ``entropy`` over masked logits), given by the same formulas in ``jax.nn`` (distrax itself
  pulls TensorFlow Probability).

It also needs ``six`` (imported by gymnax, which ``jaxmarl.wrappers.baselines`` loads); ``pip
install six`` into a separate ``--target`` folder and pass it with ``--extra-path``.

Rows (JSON lines, readable by ``benchmarks/plot_curves.py``): per update ``env_steps``,
``wall_s`` (compile time included), ``train_win_rate`` (the sampling policy's battles that ended
in this update: JaxMARL's ``returned_won_episode``), ``episode_return_mean``; then a final row
with ``sampled_eval_win_rate`` and ``greedy_eval_win_rate`` over ``--eval-episodes`` fresh battles
each (actions sampled from / argmax of the final actor, one battle per env, every chosen action
checked against the mask: ``illegal_sampled_actions``, ``illegal_greedy_actions``). The first row
is a ``{"header": ...}`` (command, commit, machine, jaxmarl version, map, env options, seed).

Command (2026-12-04, machine B: 2-core AMD EPYC with AVX512-BF16, no GPU)::

    python benchmarks/jaxmarl_reference.py --jaxmarl-repo /path/to/JaxMARL --map 3m \\
        --total-timesteps 1e6 --seed 0 --extra-path /tmp/six \\
        --out benchmarks/results/jaxmarl_reference/jaxmarl_mappo_3m_seed0.jsonl
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pickle
import sys
import time
import types
from pathlib import Path
from typing import Any, TextIO

UPSTREAM = "baselines/MAPPO/mappo_rnn_smax.py"
UPSTREAM_CONFIG = "baselines/MAPPO/config/mappo_homogenous_rnn_smax.yaml"


def _stand_ins(rows: TextIO, start: float, *, batch: int, tags: dict[str, Any]) -> None:
    """Registers the stand-in modules (see the module docstring) before the upstream import.
    ``batch``: env steps per update (``NUM_ENVS * NUM_STEPS``); ``tags``: keys every row
    carries (``run``, ``seed``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    class Categorical:
        """``distrax.Categorical(logits=...)``: the methods the upstream script calls."""

        def __init__(self, logits: Any) -> None:
            self.logits = logits

        def sample(self, seed: Any) -> Any:
            return jax.random.categorical(seed, self.logits)

        def log_prob(self, value: Any) -> Any:
            log_p = jax.nn.log_softmax(self.logits)
            return jnp.take_along_axis(log_p, value[..., None].astype(jnp.int32), -1)[..., 0]

        def entropy(self) -> Any:
            log_p = jax.nn.log_softmax(self.logits)
            return -(jnp.exp(log_p) * log_p).sum(-1)

    def log(metrics: dict[str, Any]) -> None:
        values = {k: float(np.asarray(v)) for k, v in metrics.items()}
        row = {
            **tags,
            # Upstream logs the steps before this update's batch; a row counts them after it.
            "env_steps": int(values.pop("env_step")) + batch,
            "wall_s": round(time.time() - start, 1),
            "train_win_rate": round(values.pop("win_rate"), 4),
            "episode_return_mean": round(values.pop("returns"), 4),
            **{k: round(v, 6) for k, v in values.items()},
        }
        rows.write(json.dumps(row) + "\n")
        rows.flush()

    sys.modules["distrax"] = types.SimpleNamespace(Categorical=Categorical)  # type: ignore[assignment]
    sys.modules["wandb"] = types.SimpleNamespace(log=log, init=lambda **kw: None)  # type: ignore[assignment]
    sys.modules["hydra"] = types.SimpleNamespace(main=lambda **kw: lambda f: f)  # type: ignore[assignment]
    sys.modules["omegaconf"] = types.SimpleNamespace(OmegaConf=None)  # type: ignore[assignment]


def _check_repo(repo: Path) -> None:
    for name in (UPSTREAM, UPSTREAM_CONFIG):
        if not (repo / name).is_file():
            raise SystemExit(
                f"--jaxmarl-repo {repo}: no {name} there. Fix: pass a JaxMARL checkout "
                "(git clone https://github.com/FLAIROx/JaxMARL; measured at c793d09)."
            )


def _upstream(repo: Path) -> Any:
    spec = importlib.util.spec_from_file_location("mappo_rnn_smax", repo / UPSTREAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _eval_win_rate(
    m: Any, params: Any, config: dict[str, Any], *, episodes: int, seed: int, greedy: bool
) -> dict[str, Any]:
    """Win rate of the final actor over ``episodes`` fresh battles (the first battle of each of
    ``episodes`` envs, stepped together for up to 400 steps), every chosen action checked against
    the mask. ``greedy``: argmax actions; else sampled from the masked policy, as in training."""
    import jax
    import jax.numpy as jnp

    env = m.SMAXLogWrapper(
        m.SMAXWorldStateWrapper(
            m.HeuristicEnemySMAX(
                scenario=m.map_name_to_scenario(config["MAP_NAME"]), **config["ENV_KWARGS"]
            ),
            config["OBS_WITH_AGENT_ID"],
        )
    )
    actor = m.ActorRNN(env.action_space(env.agents[0]).n, config=config)
    n_envs, rows = episodes, env.num_agents * episodes

    def evaluate(key: Any) -> tuple[Any, Any, Any]:
        key, reset_key = jax.random.split(key)
        obs, state = jax.vmap(env.reset)(jax.random.split(reset_key, n_envs))
        hidden = m.ScannedRNN.initialize_carry(rows, config["GRU_HIDDEN_DIM"])

        def step(carry: Any, _: Any) -> tuple[Any, Any]:
            obs, state, hidden, dones, finished, won, key = carry
            avail = m.batchify(jax.vmap(env.get_avail_actions)(state.env_state), env.agents, rows)
            hidden, pi = actor.apply(
                params, hidden, (m.batchify(obs, env.agents, rows)[None], dones[None], avail)
            )
            key, act_key = jax.random.split(key)
            action = (
                jnp.argmax(pi.logits, -1) if greedy else jax.random.categorical(act_key, pi.logits)
            ).reshape(rows)
            illegal = (jnp.take_along_axis(avail, action[:, None], -1) == 0).sum()
            per_agent = m.unbatchify(action, env.agents, n_envs, env.num_agents)
            key, step_key = jax.random.split(key)
            obs, state, reward, done, _ = jax.vmap(env.step)(
                jax.random.split(step_key, n_envs),
                state,
                {k: v.squeeze() for k, v in per_agent.items()},
            )
            ended = done["__all__"] & ~finished
            # JaxMARL's SMAXLogWrapper counts a win as a final team reward >= 1.
            won = won | (ended & (reward[env.agents[0]] >= 1.0))
            finished = finished | done["__all__"]
            dones = m.batchify(done, env.agents, rows).squeeze()
            return (obs, state, hidden, dones, finished, won, key), illegal

        carry = (
            obs,
            state,
            hidden,
            jnp.zeros(rows, bool),
            jnp.zeros(n_envs, bool),
            jnp.zeros(n_envs, bool),
            key,
        )
        carry, illegal = jax.lax.scan(step, carry, None, 400)
        return carry[4].sum(), carry[5].sum(), illegal.sum()

    finished, won, illegal = jax.jit(evaluate)(jax.random.PRNGKey(seed + 10_000))
    mode = "greedy" if greedy else "sampled"
    return {
        "eval_episodes": int(finished),
        f"{mode}_eval_win_rate": round(float(won) / max(int(finished), 1), 4),
        f"illegal_{mode}_actions": int(illegal),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jaxmarl-repo", type=Path, required=True, help="a JaxMARL checkout")
    parser.add_argument("--map", default="3m")
    parser.add_argument("--total-timesteps", type=float, default=1e6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-envs", type=int, default=None, help="default: upstream's 128")
    parser.add_argument("--eval-episodes", type=int, default=500)
    parser.add_argument("--extra-path", action="append", default=[], help="e.g. where six is")
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines rows")
    args = parser.parse_args(argv)

    import jax
    import yaml

    _check_repo(args.jaxmarl_repo)
    sys.path.extend(args.extra_path)
    if importlib.util.find_spec("six") is None:
        raise SystemExit(
            "JaxMARL's baselines import gymnax, which needs 'six' (not installed here). Fix: "
            "pip install --target /tmp/six six, then pass --extra-path /tmp/six."
        )
    config: dict[str, Any] = yaml.safe_load((args.jaxmarl_repo / UPSTREAM_CONFIG).read_text())
    config.update(MAP_NAME=args.map, TOTAL_TIMESTEPS=args.total_timesteps, SEED=args.seed)
    if args.num_envs:
        config["NUM_ENVS"] = args.num_envs
    from importlib.metadata import version

    from run_header import run_header

    header = run_header(
        jaxmarl=version("jaxmarl"),
        jaxmarl_baseline=f"{UPSTREAM} (checkout {args.jaxmarl_repo})",
        map=args.map,
        env_options=config["ENV_KWARGS"],
        seed=args.seed,
        settings={k: v for k, v in config.items() if k.isupper() and "WANDB" not in k},
    )
    start = time.time()
    with args.out.open("w") as rows:
        rows.write(json.dumps({"header": header}) + "\n")
        batch = config["NUM_ENVS"] * config["NUM_STEPS"]
        tags = {"run": f"jaxmarl-mappo-{config['NUM_ENVS']}envs", "seed": args.seed}
        _stand_ins(rows, start, batch=batch, tags=tags)
        m = _upstream(args.jaxmarl_repo)
        out = jax.jit(m.make_train(dict(config)))(jax.random.PRNGKey(args.seed))
        train_s = time.time() - start
        params = out["runner_state"][0][0][0].params  # the actor's TrainState
        # The final actor, kept so that the evaluation can be repeated without retraining.
        with args.out.with_suffix(".actor.pkl").open("wb") as f:
            pickle.dump(jax.device_get(params), f)
        final = {
            **tags,
            "map": args.map,
            "num_envs": config["NUM_ENVS"],
            "final_env_steps": int(args.total_timesteps) // batch * batch,
            "final_wall_s": round(train_s, 1),
        }
        for greedy in (False, True):
            evaluated = _eval_win_rate(
                m, params, config, episodes=args.eval_episodes, seed=args.seed, greedy=greedy
            )
            final.update(evaluated)
        rows.write(json.dumps(final) + "\n")
    print(json.dumps(final))


if __name__ == "__main__":
    main()
