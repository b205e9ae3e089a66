"""SMAX backend: JaxMARL's JAX re-implementation of SMAC, no StarCraft II binary needed.

Speed: one jitted function per map does the JaxMARL step (without its auto-reset), stacks the
per-agent observations and masks and computes alive counts; the host makes one
``jax.device_get`` per step and gets plain numpy arrays. Compiled functions are cached per
(map, options) in this process, so every env copy of an env runner compiles once.

Auto-reset: JaxMARL's ``env.step`` silently replaces the terminal observation by the first one
of the next episode. We call ``step_env`` (no auto-reset) instead, so the wrapper sees the true
final observation (needed to bootstrap truncated episodes) and resets explicitly.

Layout (JaxMARL ``smax_env.py``): actions ``0..3`` move, ``4`` stop, ``5 + j`` attack enemy
``j``; stop is always legal, also for dead units, so it is this backend's no-op.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import io
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rllib_ext.envs.smac.backend import BackendSpec, Step
from rllib_ext.envs.smac.settings import SMACEnvSettings

__all__ = ["XLA_PREALLOCATE", "SMAXBackend", "import_jax", "smax_map_names"]

logger = logging.getLogger(__name__)

_INSTALL_HINT = (
    'Fix: pip install "rllib-ext[smax]" (installs jax and jaxmarl; CPU wheels are enough), '
    "or use a StarCraft II backend (backend='smacv2')."
)


@contextlib.contextmanager
def _captured_stdout() -> Iterator[io.StringIO]:
    """Captures what is printed during an import, at the file-descriptor level.

    JaxMARL prints on import and its MABrax module resets ``sys.stdout``/``sys.stderr`` to the
    process's originals (``sys.__stdout__``), which defeats ``contextlib.redirect_stdout`` and
    would break pytest's or Ray's capture. We restore both objects afterwards and redirect fd 1
    into a temporary file meanwhile.
    """
    saved_out, saved_err = sys.stdout, sys.stderr
    captured = io.StringIO()
    original_stdout = sys.__stdout__
    try:
        stdout_fd = original_stdout.fileno() if original_stdout is not None else -1
    except (OSError, ValueError):  # a replaced, fd-less stream
        stdout_fd = -1
    if stdout_fd < 0 or original_stdout is None:
        try:
            with contextlib.redirect_stdout(captured):
                yield captured
        finally:
            sys.stdout, sys.stderr = saved_out, saved_err
        return
    original_stdout.flush()
    saved_fd = os.dup(stdout_fd)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), stdout_fd)
        try:
            with contextlib.redirect_stdout(captured):
                yield captured
        finally:
            with contextlib.suppress(Exception):
                original_stdout.flush()
            os.dup2(saved_fd, stdout_fd)
            os.close(saved_fd)
            sys.stdout, sys.stderr = saved_out, saved_err
            sink.seek(0)
            captured.write(sink.read().decode(errors="replace"))


XLA_PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"


def import_jax() -> Any:
    """``jax`` for the SMAX backend, with ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless the user
    set the variable: on a CUDA GPU, JAX otherwise takes 75% of the GPU's memory when it creates
    its GPU client, and a torch learner on the same GPU gets the rest. JAX reads the variable then
    (at its first computation), not at ``import jax``, which RLlib's own import may already have
    done. ``import rllib_ext`` leaves the variable alone; every path of this backend into JAX
    passes here first."""
    os.environ.setdefault(XLA_PREALLOCATE, "false")
    import jax  # lazy: JAX is the optional smax extra, out of import rllib_ext

    return jax


def _import_smax() -> tuple[Any, Any]:
    """Imports JaxMARL's SMAX lazily, its import-time prints routed to the debug log.

    Returns:
        ``(smax_env module, HeuristicEnemySMAX class)``.
    """
    if "jaxmarl.environments.smax.heuristic_enemy_smax_env" not in sys.modules:
        try:
            import_jax()
            with _captured_stdout() as captured:
                # lazy: JAX and JaxMARL are the optional smax extra
                import jaxmarl.environments.smax.heuristic_enemy_smax_env  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                f"The SMAX backend needs JAX and JaxMARL ({exc}). {_INSTALL_HINT}"
            ) from exc
        if captured.getvalue().strip():
            logger.debug("jaxmarl import printed: %s", captured.getvalue().strip())
    # lazy: JAX and JaxMARL are the optional smax extra (already imported above)
    from jaxmarl.environments.smax import smax_env
    from jaxmarl.environments.smax.heuristic_enemy_smax_env import HeuristicEnemySMAX

    return smax_env, HeuristicEnemySMAX


_SMAX_ENV_MODULE = "jaxmarl.environments.smax.smax_env"


def smax_map_names() -> list[str]:
    """The scenarios JaxMARL's SMAX knows (including any added with ``register_scenario``).

    Until JaxMARL is imported the names are read from its source: importing it runs JAX
    computations, which start XLA's thread pools and arm JAX's ``os.fork()`` warning, and
    ``rllib-ext train`` checks the map before ``ray.init`` forks Ray's processes. Scenarios can
    only be registered after the import, so until then the source holds every name.
    """
    if _SMAX_ENV_MODULE not in sys.modules:
        names = _map_names_in_source()
        if names:
            return names
    return sorted(_import_smax()[0].MAP_NAME_TO_SCENARIO)


def _map_names_in_source() -> list[str]:
    """The keys of the ``MAP_NAME_TO_SCENARIO`` dict literal in JaxMARL's ``smax_env.py``, read
    without importing JaxMARL; ``[]`` when JAX or JaxMARL is missing or the table has another
    form (the caller then imports it, which also gives the install hint)."""
    jaxmarl = importlib.util.find_spec("jaxmarl")  # top-level: located, not imported
    if importlib.util.find_spec("jax") is None or jaxmarl is None:
        return []
    for location in jaxmarl.submodule_search_locations or []:
        path = os.path.join(location, "environments", "smax", "smax_env.py")
        try:
            with open(path, encoding="utf-8") as source:
                tree = ast.parse(source.read(), filename=path)
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and any(
                    isinstance(t, ast.Name) and t.id == "MAP_NAME_TO_SCENARIO" for t in node.targets
                )
                and isinstance(node.value, ast.Dict)
            ):
                keys = node.value.keys
                names = [
                    k.value
                    for k in keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                ]
                return sorted(names) if len(names) == len(keys) else []
    return []


def _allowed_options(smax_env: Any) -> list[str]:
    params = inspect.signature(smax_env.SMAX.__init__).parameters
    names = [n for n in params if n not in ("self", "scenario", "action_type")]
    return sorted([*names, "enemy_shoots", "attack_mode"])


@dataclass
class _Compiled:
    env: Any
    reset: Callable[..., Any]
    step: Callable[..., Any]


_COMPILED: dict[tuple[str, str], _Compiled] = {}


def _compile(map_name: str, options: Mapping[str, Any]) -> _Compiled:
    cache_key = (map_name, repr(sorted(options.items())))
    if cache_key in _COMPILED:
        return _COMPILED[cache_key]
    smax_env, heuristic_enemy_smax = _import_smax()
    # lazy: JAX loads only where a SMAX battle is built
    import jax
    import jax.numpy as jnp

    if map_name not in smax_env.MAP_NAME_TO_SCENARIO:
        raise ValueError(
            f"map_name={map_name!r} is not a SMAX scenario. SMAX maps: "
            f"{', '.join(sorted(smax_env.MAP_NAME_TO_SCENARIO))}. Fix: pick one of them, "
            "register your own with jaxmarl.environments.smax.register_scenario, or use a "
            "StarCraft II backend (backend='smacv2') for SMAC-only maps such as MMM2."
        )
    allowed = _allowed_options(smax_env)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"smax_options keys {unknown} are not HeuristicEnemySMAX arguments; allowed: "
            f"{', '.join(allowed)}. Fix: drop them (StarCraft II options go in sc2_options)."
        )
    env = heuristic_enemy_smax(
        scenario=smax_env.map_name_to_scenario(map_name), action_type="discrete", **options
    )
    agents = list(env.agents)
    n_allies = int(env.num_allies)

    def pack(state: Any, obs: Mapping[str, Any], reward: Any, done: Any) -> Any:
        # One flat float32 vector = one device->host copy per step (see _Layout).
        avail = env.get_avail_actions(state)
        alive = state.state.unit_alive
        return jnp.concatenate(
            [
                jnp.stack([obs[a] for a in agents]).ravel(),
                obs["world_state"],
                jnp.stack([avail[a] for a in agents]).ravel(),
                jnp.stack([alive[:n_allies].sum(), alive[n_allies:].sum(), reward, done]),
            ]
        ).astype(jnp.float32)

    def reset(key: Any) -> tuple[Any, ...]:
        key, reset_key = jax.random.split(key)
        obs, state = env.reset(reset_key)
        return key, state, pack(state, obs, 0.0, False)

    def step(key: Any, state: Any, actions: Any) -> tuple[Any, ...]:
        key, step_key = jax.random.split(key)
        action_dict = {a: actions[i] for i, a in enumerate(agents)}
        obs, state, rewards, dones, _ = env.step_env(step_key, state, action_dict)
        # Every ally gets the same team reward in SMAX (compute_reward is per team).
        return key, state, pack(state, obs, rewards[agents[0]], dones["__all__"])

    compiled = _Compiled(env=env, reset=jax.jit(reset), step=jax.jit(step))
    _COMPILED[cache_key] = compiled
    return compiled


class SMAXBackend:
    """SMAX through one jitted step per map; numpy in, numpy out (see module docstring)."""

    def __init__(self, settings: SMACEnvSettings, seed: int | None) -> None:
        self._compiled = _compile(settings.map_name, dict(settings.smax_options))
        env = self._compiled.env
        self._n_allies = int(env.num_allies)
        self._n_enemies = int(env.num_enemies)
        self.spec = BackendSpec(
            backend="smax",
            map_name=settings.map_name,
            n_agents=self._n_allies,
            n_enemies=self._n_enemies,
            n_actions=int(env.num_ally_actions),
            obs_dim=int(env.obs_size),
            state_dim=int(env.state_size),
            # is_terminal() reads the step counter before step_env increments it, so a SMAX
            # episode is cut after max_steps + 1 steps.
            episode_limit=int(env.max_steps) + 1,
            no_op_action=int(env.num_movement_actions) - 1,
        )
        spec = self.spec
        # Offsets into the flat vector `pack` returns.
        self._obs_end = spec.n_agents * spec.obs_dim
        self._state_end = self._obs_end + spec.state_dim
        self._avail_end = self._state_end + spec.n_agents * spec.n_actions
        self.restarts = 0
        self._seed = seed
        self._key: Any = None
        self._state: Any = None

    def _unpack(self, flat: np.ndarray) -> tuple[Step, bool]:
        """``(step, episode_over)`` from the flat vector (``episode_over``: JaxMARL's done)."""
        spec = self.spec
        tail = flat[self._avail_end :]
        # Views into one host buffer; a new buffer per step, so nothing is overwritten later.
        step = Step(
            obs=flat[: self._obs_end].reshape(spec.n_agents, spec.obs_dim),
            state=flat[self._obs_end : self._state_end],
            avail=flat[self._state_end : self._avail_end].reshape(spec.n_agents, spec.n_actions),
            reward=float(tail[2]),
            dead_allies=self._n_allies - int(tail[0]),
            dead_enemies=self._n_enemies - int(tail[1]),
        )
        return step, bool(tail[3])

    def reset(self, seed: int | None) -> Step:
        import jax  # lazy: JAX loads only where a SMAX battle is built

        if seed is not None or self._key is None:
            if seed is None:
                seed = self._seed
            if seed is None:
                seed = int(np.random.SeedSequence().generate_state(1)[0])
            self._key = jax.random.PRNGKey(seed)
        self._key, self._state, flat = self._compiled.reset(self._key)
        return self._unpack(np.asarray(flat))[0]

    def step(self, actions: np.ndarray) -> Step:
        self._key, self._state, flat = self._compiled.step(
            self._key, self._state, np.asarray(actions, dtype=np.int32)
        )
        out, episode_over = self._unpack(np.asarray(flat))
        allies_gone = out.dead_allies == self._n_allies
        enemies_gone = out.dead_enemies == self._n_enemies
        # SMAX ends an episode on elimination or at max_steps (is_terminal); only elimination
        # decides the battle, the time limit truncates (values bootstrap from this obs).
        out.terminated = bool(allies_gone or enemies_gone)
        out.truncated = episode_over and not out.terminated
        out.battle_won = bool(enemies_gone and not allies_gone)
        return out

    def close(self) -> None:
        self._state = None
