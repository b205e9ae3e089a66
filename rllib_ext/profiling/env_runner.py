"""EnvRunner-side phase timers, installed through ``EnvRunnerGroup.foreach_env_runner``.

Works on RLlib's ``SingleAgentEnvRunner`` and ``MultiAgentEnvRunner`` (also remote ones).
Phases per EnvRunner (seconds since the last collect):

* ``sample``: the whole ``EnvRunner.sample`` call;
* ``env_step``: ``_try_env_step`` (the vector env's ``step``, RLlib's ``env_step_timer`` span);
* ``inference``: ``module.forward_exploration`` / ``forward_inference``;
* ``connectors``: the env-to-module and module-to-env connector pipelines.

RLlib's own EnvRunner timers measure the same spans but report an exponential moving average
per call (coefficient 0.01), which after a few hundred calls still carries the slow first
calls; these timers sum the actual calls instead.
"""

from __future__ import annotations

from typing import Any

from rllib_ext.profiling._clock import PhaseClock, TimedCallable, wrap_method

__all__ = ["collect_env_runner_phases", "install_env_runner_timers"]

_ATTR = "_rllib_ext_profiling"


def install_env_runner_timers(env_runner: Any) -> bool:
    """Installs the timers on ``env_runner`` (idempotent); ``False`` if it has no env/module."""
    if getattr(env_runner, _ATTR, None) is not None:
        return True
    if getattr(env_runner, "env", None) is None or getattr(env_runner, "module", None) is None:
        return False
    clock = PhaseClock()
    wrap_method(env_runner, "sample", clock, "sample")
    wrap_method(env_runner, "_try_env_step", clock, "env_step")
    for name in ("forward_exploration", "forward_inference"):
        wrap_method(env_runner.module, name, clock, "inference")
    for name in ("_env_to_module", "_module_to_env"):
        pipeline = getattr(env_runner, name, None)
        if pipeline is not None:
            setattr(env_runner, name, TimedCallable(pipeline, clock, "connectors"))
    setattr(env_runner, _ATTR, clock)
    return True


def collect_env_runner_phases(env_runner: Any) -> dict[str, Any] | None:
    """This EnvRunner's phase seconds and call counts since the last call; resets them."""
    clock: PhaseClock | None = getattr(env_runner, _ATTR, None)
    return None if clock is None else clock.pop()
