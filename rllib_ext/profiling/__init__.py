"""Profiling: where a PPO training iteration's wall time goes, plus a PyTorch profiler trace.

* :class:`ProfilerCallback` (``config.callbacks(ProfilerCallback.configure(...))``) works
  inside any RLlib run, Tune included;
* ``rllib-ext profile`` (:mod:`rllib_ext.cli.profile`) runs it on the ``train`` flags.
"""

from rllib_ext.profiling.breakdown import PHASES, Breakdown
from rllib_ext.profiling.callback import IterationProfiler, ProfilerCallback, check_out_dir

__all__ = ["PHASES", "Breakdown", "IterationProfiler", "ProfilerCallback", "check_out_dir"]
