"""The ``env_config`` of the SMAC envs: one dataclass, validated in ``__post_init__``.

``SMACEnvSettings.from_env_config(env_config)`` is the single place where user input for
:class:`rllib_ext.envs.smac.SMACEnv` and :func:`rllib_ext.envs.smac.parallel_env` is checked:
unknown keys, bad choices and options that would break the termination/truncation contract
raise a ``ValueError`` naming the key, the allowed values and the fix.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from rllib_ext._validation import check_choice, check_known_keys

__all__ = [
    "BACKENDS",
    "REWARD_MODES",
    "SC2_PACKAGES",
    "STATE_MODES",
    "SMACEnvSettings",
    "resolve_factory",
]

BACKENDS: tuple[str, ...] = ("auto", "smacv2", "smac", "smax")
SC2_PACKAGES: tuple[str, ...] = ("smacv2", "smac")
REWARD_MODES: tuple[str, ...] = ("copy", "split")
STATE_MODES: tuple[str, ...] = ("global", "agent_specific")

# Set by the wrapper itself: passing them in the per-backend options would silently fight the
# wrapper (continuing_episode=False merges time limits into `terminated`, see SMACEnv).
_RESERVED_SC2_OPTIONS = ("map_name", "seed", "capability_config", "continuing_episode")
_RESERVED_SMAX_OPTIONS = ("scenario", "action_type")


def resolve_factory(factory: Any) -> Callable[..., Any]:
    """Turns ``"pkg.module:attr"`` (or ``"pkg.module.attr"``) or a callable into a callable.

    Raises:
        ValueError: ``factory`` is neither a callable nor an importable path.
    """
    if callable(factory):
        return factory
    if isinstance(factory, str):
        module_name, sep, attr = factory.partition(":")
        if not sep:
            module_name, _, attr = factory.rpartition(".")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(
                f"game_factory={factory!r} cannot be imported ({type(exc).__name__}: {exc}). "
                "Fix: pass a callable or a 'package.module:ClassName' path that returns an "
                "object with the SMAC API, e.g. 'my_package.games:MyStarCraft2Env'."
            ) from None
    raise ValueError(
        f"game_factory={factory!r} must be a callable or a 'package.module:ClassName' string. "
        "Fix: leave it unset to use smac/smacv2's StarCraft2Env."
    )


@dataclass(frozen=True)
class SMACEnvSettings:
    """Options of the SMAC multi-agent env (the RLlib ``env_config``)."""

    map_name: str = "3m"
    """SMAC map / SMAX scenario, e.g. ``"3m"``, ``"2s3z"``, ``"3s5z_vs_3s6z"``, ``"10gen_protoss"``."""

    backend: Literal["auto", "smacv2", "smac", "smax"] = "auto"
    """``"smacv2"``/``"smac"``: StarCraft II through oxwhirl's packages. ``"smax"``: JaxMARL's
    SMAX (no game binary). ``"auto"``: StarCraft II when a SMAC package is importable, the game
    is installed and the map file exists, otherwise SMAX; the choice is logged."""

    prefer_sc2: Literal["smacv2", "smac"] = "smacv2"
    """The StarCraft II package ``backend="auto"`` tries first (the other one second)."""

    seed: int | None = None
    """Base seed. Each RLlib env copy derives its own from ``(seed, worker_index,
    vector_index)``; ``None`` draws fresh entropy. A seed passed to ``reset(seed=...)`` wins."""

    reward_mode: Literal["copy", "split"] = "copy"
    """How the team reward reaches agents: ``"copy"`` gives every agent the team reward,
    ``"split"`` gives every agent ``team_reward / n_agents`` (sum over agents = team reward)."""

    include_state: bool = True
    """Add the global state under ``"state"`` to every agent's observation (central critic)."""

    state_mode: Literal["global", "agent_specific"] = "global"
    """What ``"state"`` holds per agent: ``"global"``: the global state ``[state_dim]``, the same
    for every agent; ``"agent_specific"``: the global state followed by the agent's one-hot id
    ``[state_dim + n_agents]`` (MAPPO's agent-specific state for the central critic, Yu et al.
    2022). Needs ``include_state=True``."""

    obs_agent_id: bool = False
    """Append the agent's one-hot id to its ``"observations"`` (``[obs_dim + n_agents]``), as
    PyMARL's and MAPPO's SMAC runs do (``obs_agent_id``): with one shared policy it lets
    otherwise identical agents act differently."""

    capability_config: Mapping[str, Any] | None = None
    """SMACv2 only: the ``capability_config`` of ``StarCraftCapabilityEnvWrapper`` (``n_units``,
    ``n_enemies``, ``team_gen``, ``start_positions``, ...). ``None``: plain ``StarCraft2Env``."""

    sc2_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for smac/smacv2's ``StarCraft2Env`` (``difficulty``, ``step_mul``,
    ``reward_*``, ``obs_*``, ...). Ignored when SMAX runs."""

    smax_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for JaxMARL's ``HeuristicEnemySMAX`` (``max_steps``, ``enemy_shoots``,
    ``attack_mode``, ``see_enemy_actions``, ``walls_cause_death``, ``won_battle_bonus``, ...).
    Ignored when StarCraft II runs."""

    game_factory: Any = None
    """StarCraft II backends only: a callable (or ``"pkg.module:Class"``) taking
    ``StarCraft2Env``'s keyword arguments and returning an object with the SMAC API. For test
    stand-ins and custom launchers; ``None`` uses the real package."""

    max_restarts: int = 3
    """StarCraft II only: consecutive failed ``reset()`` calls (game crashes) tolerated before
    the error is raised; each restart is counted in ``info["sc2_restarts"]``."""

    def __post_init__(self) -> None:
        if not isinstance(self.map_name, str) or not self.map_name:
            raise ValueError(
                f"map_name={self.map_name!r} must be a non-empty string. "
                'Fix: pass e.g. env_config={"map_name": "3m"}.'
            )
        check_choice("backend", self.backend, BACKENDS, example="env_config={'backend': 'smax'}")
        check_choice(
            "prefer_sc2",
            self.prefer_sc2,
            SC2_PACKAGES,
            example="env_config={'prefer_sc2': 'smacv2'}",
        )
        check_choice(
            "reward_mode",
            self.reward_mode,
            REWARD_MODES,
            example="env_config={'reward_mode': 'copy'}",
        )
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise ValueError(f"seed={self.seed!r} must be an int or None. Fix: 'seed': 0.")
        if not isinstance(self.include_state, bool):
            raise ValueError(
                f"include_state={self.include_state!r}; allowed: True, False. "
                "Fix: 'include_state': True (needed by the central critic)."
            )
        if not isinstance(self.obs_agent_id, bool):
            raise ValueError(
                f"obs_agent_id={self.obs_agent_id!r}; allowed: True, False. "
                "Fix: 'obs_agent_id': True (one-hot agent id in every observation)."
            )
        check_choice(
            "state_mode",
            self.state_mode,
            STATE_MODES,
            example="env_config={'state_mode': 'agent_specific'}",
        )
        if self.state_mode != "global" and not self.include_state:
            raise ValueError(
                f"state_mode={self.state_mode!r} needs include_state=True (there is no 'state' "
                "to extend otherwise). Fix: drop state_mode or set 'include_state': True."
            )
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int):
            raise ValueError(f"max_restarts={self.max_restarts!r} must be an int >= 0.")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts={self.max_restarts!r} must be >= 0. Fix: 3.")
        for key, options, reserved in (
            ("sc2_options", self.sc2_options, _RESERVED_SC2_OPTIONS),
            ("smax_options", self.smax_options, _RESERVED_SMAX_OPTIONS),
        ):
            if not isinstance(options, Mapping):
                raise ValueError(f"{key}={options!r} must be a dict of keyword arguments.")
            clash = sorted(set(options) & set(reserved))
            if clash:
                raise ValueError(
                    f"{key} may not set {clash}: the wrapper sets them itself "
                    f"({', '.join(reserved)}). Fix: use the top-level env_config keys "
                    "(map_name, seed, capability_config) and drop the others; SMAC always runs "
                    "with continuing_episode=True so a time limit is reported as truncated."
                )
        if self.capability_config is not None and not isinstance(self.capability_config, Mapping):
            raise ValueError(
                f"capability_config={self.capability_config!r} must be a dict (SMACv2's "
                "capability_config) or None."
            )
        if self.capability_config is not None and self.backend == "smac":
            raise ValueError(
                "capability_config is a SMACv2 feature but backend='smac' (SMAC v1). "
                "Fix: use backend='smacv2' (or 'auto'), or drop capability_config."
            )
        if self.game_factory is not None:
            resolve_factory(self.game_factory)

    @classmethod
    def from_env_config(cls, env_config: Mapping[str, Any] | None) -> SMACEnvSettings:
        """Builds settings from an RLlib ``env_config`` (a dict or ``EnvContext``).

        Raises:
            ValueError: an unknown key (with the closest known one) or a bad value.
        """
        config = dict(env_config or {})
        check_known_keys(
            sorted(config),
            [f.name for f in fields(cls)],
            what="SMAC env_config key(s)",
            fix="StarCraft2Env arguments go in 'sc2_options', SMAX scenario arguments in "
            "'smax_options'.",
        )
        return cls(**config)
