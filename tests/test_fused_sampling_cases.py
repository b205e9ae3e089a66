"""Issue 40's fused-sampling cases, each against stock RLlib's ``SingleAgentEnvRunner``.

Same config, weights, env seed and torch seed before each call (``num_env_runners=0``): the
fused runner either returns RLlib's episodes (and RLlib's result keys) or falls back to RLlib's
loop from the state RLlib's loop would start from, with a ``FusedSamplingFallback`` warning.
"""

from __future__ import annotations

import warnings
from collections import defaultdict

import numpy as np
import pytest
import torch
import tree
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.common import TensorToNumpy
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.module_to_env import (
    GetActions,
    ListifyDataForVectorEnv,
    NormalizeAndClipActions,
    RemoveSingleTsTimeRankFromBatch,
    UnBatchToIndividualItems,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.models.torch.torch_distributions import TorchCategorical

from rllib_ext.fused_sampling import FUSED_METRIC, FusedSamplingFallback
from rllib_ext.sampling_protocol import fused_equivalent
from tests.test_fused_sampling import _assert_same_chunks, _config, _pair


def _run_both(config, calls, *, nested=()):
    """Samples ``calls`` (kwargs per call) on the fused runner and on stock RLlib's; asserts
    the same chunks call by call (``nested``: extra outputs compared leaf by leaf); returns
    both runners."""
    ours, theirs = _pair(config)
    ids: dict[str, str] = {}
    for call, kwargs in enumerate(calls):
        torch.manual_seed(call)
        mine = ours.sample(explore=True, **kwargs)
        torch.manual_seed(call)
        ref = theirs.sample(explore=True, **kwargs)
        for key in nested:
            for ep, ref_ep in zip(mine, ref, strict=True):
                a, b = ep.extra_model_outputs.pop(key), ref_ep.extra_model_outputs.pop(key)
                assert a.lookback == b.lookback
                for x, y in zip(tree.flatten(a.data), tree.flatten(b.data), strict=True):
                    assert x.dtype == y.dtype
                    np.testing.assert_allclose(x, y, rtol=1e-6)
        _assert_same_chunks(mine, ref, ids, f"call {call} {kwargs}")
    return ours, theirs


class _OwnActions(DefaultPPOTorchRLModule):
    """Computes ``actions`` (and their log-probabilities) itself, every ``every``-th forward."""

    every = 1

    def _forward_exploration(self, batch, **kwargs):
        out = super()._forward_exploration(batch, **kwargs)
        self.forwards = getattr(self, "forwards", 0) + 1
        if self.forwards % self.every == 0:
            dist = TorchCategorical.from_logits(out[Columns.ACTION_DIST_INPUTS])
            out[Columns.ACTIONS] = dist.sample()
            out[Columns.ACTION_LOGP] = dist.logp(out[Columns.ACTIONS]) * 0.5
        return out


class _SometimesOwnActions(_OwnActions):
    every = 3


class _NestedExtra(DefaultPPOTorchRLModule):
    """Returns a nested dict extra model output."""

    def _forward_exploration(self, batch, **kwargs):
        out = super()._forward_exploration(batch, **kwargs)
        logits = out[Columns.ACTION_DIST_INPUTS]
        out["nested"] = {"double": logits * 2.0, "inner": {"sum": logits.sum(-1)}}
        return out


def _with_module(module_class, **env_runners):
    spec = RLModuleSpec(module_class=module_class, model_config={"fcnet_hiddens": [16]})
    return _config("CartPole-v1", **env_runners).rl_module(rl_module_spec=spec)


@pytest.mark.parametrize("module_class", [_OwnActions, _SometimesOwnActions])
def test_module_computed_actions_sample_fused_like_rllib(module_class):
    """Cases 1 and 12: a module computing ``actions`` itself (on every forward, or on some
    only) runs fused with RLlib's episodes from the first call on, nothing discarded."""
    ours, theirs = _run_both(_with_module(module_class), [{"num_timesteps": 60}] * 3)
    mine, ref = ours.get_metrics(), theirs.get_metrics()
    assert mine[FUSED_METRIC].peek() == 1.0
    assert mine["num_episodes_lifetime"].peek() == ref["num_episodes_lifetime"].peek() > 0


def test_nested_extra_model_outputs_sample_fused_like_rllib():
    """Case 4: a nested dict extra output is kept per env, as RLlib's pieces split it."""
    ours, _ = _run_both(_with_module(_NestedExtra), [{"num_timesteps": 60}] * 2, nested=["nested"])
    assert ours.get_metrics()[FUSED_METRIC].peek() == 1.0


def test_lookback_longer_than_a_calls_steps_is_rllibs():
    """Case 3: ``episode_lookback_horizon`` 4 with 2 steps per env per call: the chunks carry
    RLlib's lookback (reaching into the previous chunk's own lookback)."""
    config = _config("CartPole-v1", episode_lookback_horizon=4)
    ours, _ = _run_both(config, [{"num_timesteps": 8}] * 4)
    assert ours.get_metrics()[FUSED_METRIC].peek() == 1.0


def _keys(metrics, prefix=()):
    keys = set()
    for key, value in metrics.items():
        if isinstance(value, dict):
            keys |= _keys(value, (*prefix, key))
        else:
            keys.add("/".join((*prefix, key)))
    return keys


def test_result_keys_are_rllibs_plus_the_fused_flag():
    """Case 5: RLlib's connector timers and episode-length sums are there too."""
    ours, theirs = _run_both(_config("CartPole-v1"), [{"num_timesteps": 40}, {"num_episodes": 2}])
    assert _keys(ours.get_metrics()) == _keys(theirs.get_metrics()) | {FUSED_METRIC}


_END_EPISODES: dict[int, list] = defaultdict(list)


class _EndTypes(RLlibCallback):
    def on_episode_end(self, *, episode, env_runner, prev_episode_chunks, **kwargs):
        chunks = [(type(c.rewards), c.is_numpy) for c in prev_episode_chunks]
        _END_EPISODES[id(env_runner)].append(
            (episode.is_numpy, type(episode.get_rewards()), len(episode), chunks)
        )


def test_on_episode_end_gets_the_list_based_episode_as_in_rllib():
    """Case 9: ``on_episode_end`` sees the episode before ``to_numpy()``, as RLlib's does."""
    _END_EPISODES.clear()
    ours, theirs = _run_both(_config("CartPole-v1").callbacks(_EndTypes), [{"num_timesteps": 80}])
    mine, ref = _END_EPISODES[id(ours)], _END_EPISODES[id(theirs)]
    assert mine and mine == ref
    assert not mine[0][0] and mine[0][1] is list


def _user_normalize(env, spaces, device=None):
    return [
        GetActions(),
        TensorToNumpy(),
        UnBatchToIndividualItems(),
        RemoveSingleTsTimeRankFromBatch(),
        NormalizeAndClipActions(normalize_actions=False, clip_actions=True),
        ListifyDataForVectorEnv(),
    ]


def test_a_users_pieces_with_other_flags_fall_back_from_rllibs_first_state():
    """Cases 11 and 1: the config's ``NormalizeAndClipActions`` flags differ from the user's
    piece: RLlib's loop runs, from the first call on exactly as stock (no reset or RNG draw
    before the decision), with one warning naming the piece's flags."""
    config = _config("Pendulum-v1").env_runners(
        module_to_env_connector=_user_normalize,
        add_default_connectors_to_module_to_env_pipeline=False,
    )
    with pytest.warns(FusedSamplingFallback, match="module-to-env") as caught:
        ours, _ = _run_both(config, [{"num_timesteps": 60}] * 2)
    assert ours.get_metrics()[FUSED_METRIC].peek() == 0.0
    assert len([w for w in caught if issubclass(w.category, FusedSamplingFallback)]) == 1


class _Marked(ConnectorV2):
    rllib_ext_fused_equivalent = True

    def __call__(self, *, batch, **kwargs):
        return batch


class _MarkedSubclass(_Marked):
    def __call__(self, *, batch, **kwargs):
        return batch


def test_the_fused_equivalent_marker_counts_on_its_own_class_only():
    """Case 11: a subclass of a marked piece is not fused-equivalent by inheritance."""
    assert fused_equivalent(_Marked()) and not fused_equivalent(_MarkedSubclass())
    for piece, fused in ((_Marked, 1.0), (_MarkedSubclass, 0.0)):
        config = _config("CartPole-v1").env_runners(
            env_to_module_connector=lambda env, spaces, device, piece=piece: piece()
        )
        runner = config.env_runner_cls(config=config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FusedSamplingFallback)
            runner.sample(num_timesteps=20)
        assert runner.get_metrics()[FUSED_METRIC].peek() == fused, piece
        runner.stop()


def test_fallback_warns_once_per_runner_and_reason():
    """Case 6: a library user sees the fallback (a warning), once per runner and reason."""
    config = _config("CartPole-v1").env_runners(episodes_to_numpy=False)
    for _ in range(2):  # each runner warns once
        runner = config.env_runner_cls(config=config)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                runner.sample(num_timesteps=20)
        fallbacks = [w for w in caught if issubclass(w.category, FusedSamplingFallback)]
        assert len(fallbacks) == 1 and "episodes_to_numpy=False" in str(fallbacks[0].message)
        runner.stop()
