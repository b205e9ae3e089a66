"""StarCraft II backend: SMACv2 (``smacv2``) or SMAC v1 (``smac``) from oxwhirl.

The game is driven through the documented SMAC API only: ``reset()``, ``step(actions) ->
(reward, terminated, info)``, ``get_obs()``, ``get_state()``, ``get_avail_actions()``,
``get_env_info()``, ``close()``. Behaviour of those packages this module relies on:

* ``continuing_episode=True`` is always passed: only then does SMAC mark a time limit with
  ``info["episode_limit"]``, which we report as ``truncated`` (not ``terminated``).
* A protocol or connection error inside ``step`` makes SMAC relaunch the game and return
  ``0, True, {}``; an exception may also escape. Both end the episode as ``truncated`` (the last
  good observation is returned), the game is restarted and ``restarts`` counts it.
* SMACv2's ``StarCraftCapabilityEnvWrapper.reset()`` returns ``None`` after it retried a failed
  reset, so observations are always read with the getters after ``reset()``.
* Index 0 (no-op) is the only legal action of a dead agent.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rllib_ext.envs.smac.backend import BackendSpec, Step
from rllib_ext.envs.smac.settings import SMACEnvSettings, resolve_factory

__all__ = ["SC2Backend", "StarCraftIINotFoundError", "availability", "sc2_map_names", "sc2_path"]

logger = logging.getLogger(__name__)

_PIP = {
    "smacv2": "pip install git+https://github.com/oxwhirl/smacv2.git",
    "smac": "pip install git+https://github.com/oxwhirl/smac.git",
}

# Programming errors are re-raised at once; anything else from the game is a crash.
_NOT_A_CRASH = (TypeError, ValueError, AssertionError, AttributeError, KeyError, IndexError)


class StarCraftIINotFoundError(ImportError):
    """The SMAC package, the StarCraft II game or the map files are missing."""


def package_installed(package: str) -> bool:
    """Whether ``smacv2`` / ``smac`` (oxwhirl's, not PyPI's SMAC3 ``smac``) is importable."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        return False
    # PyPI's `smac` is SMAC3, a hyper-parameter optimiser without `smac.env`.
    return importlib.util.find_spec(f"{package}.env") is not None


def sc2_path() -> Path:
    """Where smac/pysc2 look for the game: ``$SC2PATH``, else the platform default."""
    if os.environ.get("SC2PATH"):
        return Path(os.environ["SC2PATH"]).expanduser()
    if sys.platform == "darwin":
        return Path("/Applications/StarCraft II")
    if sys.platform == "win32":
        return Path("C:/Program Files (x86)/StarCraft II")
    return Path("~/StarCraftII").expanduser()


def install_steps(package: str) -> str:
    """The exact steps to make ``package`` run (also used in the README)."""
    return (
        "To run StarCraft II: (1) download the Linux game SC2.4.10 "
        "(http://blzdistsc2-a.akamaihd.net/Linux/SC2.4.10.zip, password 'iagreetotheeula'), "
        "unzip it and `export SC2PATH=/path/to/StarCraftII` (default ~/StarCraftII); "
        "(2) unzip SMAC_Maps.zip (https://github.com/oxwhirl/smacv2/releases/download/maps/"
        "SMAC_Maps.zip) into $SC2PATH/Maps/ so that $SC2PATH/Maps/SMAC_Maps/*.SC2Map exist; "
        f"(3) `{_PIP[package]}`. No game binary? Use backend='smax' "
        '(pip install "rllib-ext[smax]").'
    )


def _map_registry(package: str) -> dict[str, dict[str, Any]]:
    module = importlib.import_module(f"{package}.env.starcraft2.maps.smac_maps")
    return dict(module.get_smac_map_registry())


def sc2_map_names(package: str) -> list[str]:
    """Maps in ``package``'s registry (needs the package installed)."""
    return sorted(_map_registry(package))


def _map_file(package: str, map_name: str) -> Path:
    file_name = _map_registry(package)[map_name].get("map_name", map_name)
    return sc2_path() / "Maps" / "SMAC_Maps" / f"{file_name}.SC2Map"


def availability(package: str, map_name: str) -> tuple[bool, str]:
    """Whether ``package`` can run ``map_name`` here, and why not (for ``backend="auto"``)."""
    if not package_installed(package):
        return False, "package not installed"
    if not sc2_path().is_dir():
        return False, f"StarCraft II not found at {sc2_path()} (SC2PATH)"
    try:
        registry = _map_registry(package)
    except Exception as exc:  # noqa: BLE001 - a broken install means "not available"
        return False, f"cannot import its map registry ({type(exc).__name__}: {exc})"
    if map_name not in registry:
        return False, f"map {map_name!r} not in its registry"
    if not _map_file(package, map_name).is_file():
        return False, f"map file {_map_file(package, map_name)} missing"
    return True, "ok"


def _check_installed(package: str, map_name: str) -> None:
    if not package_installed(package):
        raise StarCraftIINotFoundError(
            f"backend={package!r} needs oxwhirl's {package!r} package, which is not installed "
            "(PyPI's 'smac' is SMAC3, a different project). " + install_steps(package)
        )
    if not sc2_path().is_dir():
        raise StarCraftIINotFoundError(
            f"StarCraft II is not installed at {sc2_path()} (from SC2PATH or the default). "
            + install_steps(package)
        )
    registry = _map_registry(package)
    if map_name not in registry:
        raise ValueError(
            f"map_name={map_name!r} is not a {package} map. {package} maps: "
            f"{', '.join(sorted(registry))}. Fix: pick one of them; SMACv2's procedural maps are "
            "10gen_protoss/10gen_terran/10gen_zerg."
        )
    if not _map_file(package, map_name).is_file():
        raise StarCraftIINotFoundError(
            f"Map file {_map_file(package, map_name)} is missing. " + install_steps(package)
        )


def _real_factory(package: str, capability_config: Any) -> Callable[..., Any]:
    if package == "smacv2":
        # lazy: StarCraft II packages are optional and load only when a battle is built
        from smacv2.env import StarCraft2Env, StarCraftCapabilityEnvWrapper

        return StarCraftCapabilityEnvWrapper if capability_config is not None else StarCraft2Env
    from smac.env import StarCraft2Env  # lazy: optional StarCraft II package

    return StarCraft2Env


class SC2Backend:
    """A SMAC/SMACv2 game behind the :class:`~rllib_ext.envs.smac.backend.Backend` interface."""

    def __init__(self, settings: SMACEnvSettings, seed: int | None, *, package: str) -> None:
        self._settings = settings
        self._package = package
        if settings.game_factory is not None:
            self._factory = resolve_factory(settings.game_factory)
        else:
            _check_installed(package, settings.map_name)
            self._factory = _real_factory(package, settings.capability_config)
        self._seed = seed
        self._game = self._make_game()
        self._launched = False
        info = self._game.get_env_info()
        self.spec = BackendSpec(
            backend=package,
            map_name=settings.map_name,
            n_agents=int(info["n_agents"]),
            n_enemies=int(getattr(self._game, "n_enemies", 0)),
            n_actions=int(info["n_actions"]),
            obs_dim=int(np.prod(info["obs_shape"])),
            state_dim=int(np.prod(info["state_shape"])),
            episode_limit=int(info["episode_limit"]),
            no_op_action=0,
        )
        self.restarts = 0
        self._last: Step | None = None

    def _make_game(self) -> Any:
        kwargs: dict[str, Any] = {
            **self._settings.sc2_options,
            "map_name": self._settings.map_name,
            "seed": self._seed,
            "continuing_episode": True,
        }
        if self._settings.capability_config is not None:
            # The SMACv2 wrapper writes into its config; keep the user's dict intact.
            kwargs["capability_config"] = copy.deepcopy(dict(self._settings.capability_config))
        return self._factory(**kwargs)

    def _restart_game(self) -> None:
        """Closes the (possibly dead) game and builds a fresh one; it launches on ``reset()``."""
        try:
            self._game.close()
        except Exception as exc:  # noqa: BLE001 - the process may already be gone
            logger.debug("closing a crashed StarCraft II failed: %s", exc)
        self._game = self._make_game()
        self._launched = False

    def _observe(self) -> Step:
        game = self._game
        obs = np.asarray(game.get_obs(), dtype=np.float32).reshape(self.spec.n_agents, -1)
        state = np.asarray(game.get_state(), dtype=np.float32).reshape(-1)
        avail = np.asarray(game.get_avail_actions(), dtype=np.float32)
        if avail.shape != (self.spec.n_agents, self.spec.n_actions):
            raise RuntimeError(
                f"get_avail_actions() returned shape {avail.shape}, expected "
                f"{(self.spec.n_agents, self.spec.n_actions)}: the {self._package} version does "
                "not follow the SMAC API this wrapper was written for."
            )
        return Step(obs=obs, state=state, avail=avail)

    def reset(self, seed: int | None) -> Step:
        if seed is not None and seed != self._seed:
            if self._launched:
                logger.info(
                    "StarCraft II takes its seed at launch; reset(seed=%s) is ignored for the "
                    "running game (seed %s).",
                    seed,
                    self._seed,
                )
            else:
                self._seed = seed
                self._game = self._make_game()
        failures = 0
        while True:
            try:
                # SMACv2's capability wrapper may return None here; read the getters instead.
                self._game.reset()
                self._launched = True
                self._last = self._observe()
                return self._last
            except _NOT_A_CRASH:
                raise
            except Exception as exc:  # noqa: BLE001 - websocket/protocol/process errors
                failures += 1
                if failures > self._settings.max_restarts:
                    raise RuntimeError(
                        f"StarCraft II failed to reset {failures} times in a row (last error: "
                        f"{type(exc).__name__}: {exc}). Fix: check the game install "
                        f"({sc2_path()}), free memory/ports, or raise max_restarts."
                    ) from exc
                logger.warning(
                    "StarCraft II reset failed (%s: %s); restarting the game (%d/%d).",
                    type(exc).__name__,
                    exc,
                    failures,
                    self._settings.max_restarts,
                )
                self.restarts += 1
                self._restart_game()

    def _crashed(self) -> Step:
        last = self._last
        if last is None:
            raise RuntimeError("StarCraft II crashed before the first reset().")
        return Step(
            obs=last.obs,
            state=last.state,
            avail=last.avail,
            truncated=True,
            crashed=True,
            dead_allies=last.dead_allies,
            dead_enemies=last.dead_enemies,
        )

    def step(self, actions: np.ndarray) -> Step:
        try:
            reward, terminated, info = self._game.step([int(a) for a in actions])
        except _NOT_A_CRASH:
            raise
        except Exception as exc:  # noqa: BLE001 - websocket/protocol/process errors
            self.restarts += 1
            logger.warning(
                "StarCraft II crashed in step (%s: %s); episode truncated, game restarted.",
                type(exc).__name__,
                exc,
            )
            self._restart_game()
            return self._crashed()
        if terminated and not info:
            # SMAC's answer to a protocol error: it already relaunched the game.
            self.restarts += 1
            logger.warning("StarCraft II returned (0, True, {}) (a crash); episode truncated.")
            return self._crashed()
        out = self._observe()
        time_limit = bool(info.get("episode_limit", False))
        out.reward = float(reward)
        out.terminated = bool(terminated) and not time_limit
        out.truncated = bool(terminated) and time_limit
        out.battle_won = bool(info.get("battle_won", False))
        out.dead_allies = int(info.get("dead_allies", 0))
        out.dead_enemies = int(info.get("dead_enemies", 0))
        self._last = out
        return out

    def close(self) -> None:
        try:
            self._game.close()
        except Exception as exc:  # noqa: BLE001 - closing must not raise
            logger.debug("closing StarCraft II failed: %s", exc)
