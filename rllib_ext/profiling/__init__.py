"""Profiling: where a PPO training iteration's wall time goes, plus a PyTorch profiler trace.

* :func:`enable_profiling` (``enable_profiling(config, out_dir=..., iterations=[...])``) works
  in any RLlib run, Tune included: timing EnvRunner and Learner subclasses selected by the
  config, phase seconds logged through RLlib's ``MetricsLogger``;
* ``rllib-ext profile`` (:mod:`rllib_ext.cli.profile`) runs it on the ``train`` flags.
"""

from rllib_ext.profiling.breakdown import PHASES, Breakdown, breakdown_of_result
from rllib_ext.profiling.callback import ProfilerCallback, check_out_dir, enable_profiling

__all__ = [
    "PHASES",
    "Breakdown",
    "ProfilerCallback",
    "breakdown_of_result",
    "check_out_dir",
    "enable_profiling",
]
