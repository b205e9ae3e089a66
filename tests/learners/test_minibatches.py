"""``IndexedMinibatches`` against RLlib's ``MiniBatchCyclicIterator``, minibatch by minibatch.

The same train batch and settings through both: every minibatch holds the same rows in the same
order (torch, NumPy and nested columns), with the same flags and ``env_steps``; NumPy's global
generator ends in the same state (RLlib's shuffles draw from it); the module batches are left in
the same order, or untouched where the caller does not hold the batch. Batches the index path
cannot reproduce get RLlib's iterator, a warning and the metric. ``num_minibatches=N`` gives N
minibatches per epoch on flat and sequence batches, with one learner only.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from ray.rllib.core import ALL_MODULES
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

from rllib_ext import PPOConfig
from rllib_ext.learners.minibatches import (
    INDEXED_MINIBATCHES_KEY,
    IndexedMinibatches,
    RLlibMinibatches,
    indexed_or_rllib,
    why_not_indexed,
    with_num_minibatches,
)
from tests.learners.test_lean_update import _config, _episodes, _learner, _update

MID = "default_policy"


def _module_batch(rows: int, seed: int) -> SampleBatch:
    gen = torch.Generator().manual_seed(seed)
    return SampleBatch(
        {
            "obs": torch.randn(rows, 3, generator=gen),
            "actions": torch.arange(rows),
            "advantages": np.arange(rows, dtype=np.float32) * 0.5,
            "nested": {"a": torch.arange(rows) * 10, "b": {"c": np.arange(rows) - 7}},
        }
    )


def _batch(sizes: dict[str, int]) -> MultiAgentBatch:
    batches = {mid: _module_batch(n, seed) for seed, (mid, n) in enumerate(sizes.items())}
    return MultiAgentBatch(batches, env_steps=sum(sizes.values()) + 3)


def _assert_same(a, b) -> None:
    if isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype
        assert torch.equal(a, b)
    else:
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def _run(iterator_cls, batch, seed, **settings):
    np.random.seed(seed)
    out = [copy.copy(mb) for mb in iterator_cls(batch, **settings)]
    return out, np.random.get_state()[1].copy()


CASES = [
    # (module sizes, epochs, minibatch size, shuffle, total minibatches)
    ({"p": 100}, 3, 32, True, 0),
    ({"p": 100}, 2, 25, True, 0),  # minibatches end exactly at the batch end
    ({"p": 100}, 2, 150, True, 0),  # minibatch larger than the batch: cycles within one
    ({"p": 100}, 3, 32, False, 0),
    ({"p": 100}, 1, 100, True, 0),
    ({"p": 100, "q": 37}, 3, 20, True, 0),  # two modules, different lengths
    ({"p": 100, "q": 37}, 1, 16, True, 11),  # a fixed number of minibatches (multi-learner)
]


@pytest.mark.parametrize(("sizes", "epochs", "size", "shuffle", "total"), CASES)
def test_same_minibatches_as_rllibs_iterator(sizes, epochs, size, shuffle, total):
    settings = dict(
        num_epochs=epochs,
        minibatch_size=size,
        shuffle_batch_per_epoch=shuffle,
        num_total_minibatches=total,
    )
    theirs_batch, ours_batch = _batch(sizes), _batch(sizes)
    theirs, their_rng = _run(MiniBatchCyclicIterator, theirs_batch, 5, **settings)
    ours, our_rng = _run(IndexedMinibatches, ours_batch, 5, **settings)
    assert len(ours) == len(theirs) >= epochs
    for mine, reference in zip(ours, theirs, strict=True):
        assert isinstance(mine, MultiAgentBatch)
        assert mine.env_steps() == reference.env_steps()
        assert list(mine.policy_batches) == list(reference.policy_batches)
        for mid, module_batch in reference.policy_batches.items():
            got = mine.policy_batches[mid]
            assert isinstance(got, SampleBatch) and len(got) == len(module_batch) == size
            assert got.num_grad_updates == module_batch.num_grad_updates
            assert (got.zero_padded, got.time_major, got.max_seq_len) == (
                module_batch.zero_padded,
                module_batch.time_major,
                module_batch.max_seq_len,
            )
            _assert_same(dict(got), dict(module_batch))
    np.testing.assert_array_equal(our_rng, their_rng)  # the same draws from NumPy's generator
    for mid in sizes:  # left in the order RLlib's in-place shuffles leave it
        _assert_same(dict(ours_batch.policy_batches[mid]), dict(theirs_batch.policy_batches[mid]))
    if shuffle and epochs > 1:  # the rows did move (so the order check says something)
        first = ours[0].policy_batches["p"]["actions"].tolist()
        later = ours[-1].policy_batches["p"]["actions"].tolist()
        assert later != sorted(later) or first != later
    # A batch no caller holds (built from episodes in the update): the same minibatches and
    # draws, and the batch is not permuted at the end.
    kept_batch = _batch(sizes)
    kept, kept_rng = _run(IndexedMinibatches, kept_batch, 5, **settings, leave_final_order=False)
    for mine, reference in zip(kept, theirs, strict=True):
        for mid, module_batch in reference.policy_batches.items():
            _assert_same(dict(mine.policy_batches[mid]), dict(module_batch))
    np.testing.assert_array_equal(kept_rng, their_rng)
    for mid in sizes:
        _assert_same(dict(kept_batch.policy_batches[mid]), dict(_batch(sizes).policy_batches[mid]))


def test_empty_module_batch_raises_like_rllib():
    batch = MultiAgentBatch({"p": _module_batch(0, 0)}, env_steps=0)
    with pytest.raises(ValueError, match="module_id p is empty"):
        next(
            iter(
                IndexedMinibatches(
                    batch, num_epochs=1, minibatch_size=4, shuffle_batch_per_epoch=False
                )
            )
        )


class _Module:
    def __init__(self, stateful: bool) -> None:
        self.stateful = stateful

    def is_stateful(self) -> bool:
        return self.stateful


class _Learner:
    def __init__(self, stateful: bool) -> None:
        self.module = {"p": _Module(stateful)}
        self.metrics = MetricsLogger()


def test_why_not_indexed_names_what_it_cannot_reproduce():
    assert why_not_indexed({"p": _Module(False)}, _batch({"p": 10})) is None
    assert "stateful" in why_not_indexed({"p": _Module(True)}, _batch({"p": 10}))
    listed = _batch({"p": 4})
    listed.policy_batches["p"]["infos"] = [{}, {}, {}, {}]
    assert "'infos'" in why_not_indexed({"p": _Module(False)}, listed)


def _cyclic(batch):
    return MiniBatchCyclicIterator(
        batch, num_epochs=2, minibatch_size=4, shuffle_batch_per_epoch=True
    )


def test_indexed_or_rllib_replaces_only_what_it_reproduces():
    learner, warned = _Learner(stateful=False), set()
    got = indexed_or_rllib(learner, _cyclic(_batch({"p": 10})), warned)
    assert isinstance(got, IndexedMinibatches) and got.leave_final_order
    assert learner.metrics.peek((ALL_MODULES, INDEXED_MINIBATCHES_KEY)) == 1.0
    internal = indexed_or_rllib(
        learner, _cyclic(_batch({"p": 10})), warned, leave_final_order=False
    )
    assert isinstance(internal, IndexedMinibatches) and not internal.leave_final_order
    other = [MultiAgentBatch({}, 0)]  # not RLlib's cyclic iterator: untouched, nothing logged
    assert indexed_or_rllib(_Learner(False), other, warned) is other


def test_fallback_keeps_rllibs_iterator_warns_once_and_logs_the_metric():
    learner, warned = _Learner(stateful=True), set()
    with pytest.warns(RLlibMinibatches, match="stateful"):
        first = _cyclic(_batch({"p": 10}))
        assert indexed_or_rllib(learner, first, warned) is first
    assert learner.metrics.peek((ALL_MODULES, INDEXED_MINIBATCHES_KEY)) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason again: no second warning
        second = _cyclic(_batch({"p": 10}))
        assert indexed_or_rllib(learner, second, warned) is second


@pytest.mark.parametrize(("num_minibatches", "steps"), [(4, 3 * 4), (1, 3), (5, 3 * 5)])
def test_num_minibatches_sets_the_optimizer_steps_per_epoch(num_minibatches, steps):
    """``num_minibatches=N``: N Adam steps in each of the 3 epochs, whatever the train batch's
    row count (the config's ``minibatch_size`` of 64 rows would give 20 in all)."""
    learner = _learner(_config(PPOConfig, "CartPole-v1", num_minibatches=num_minibatches))
    _update(learner, _episodes("CartPole-v1"))
    ((_, optim),) = learner.get_optimizers_for_module(MID)
    assert {int(optim.state[p]["step"]) for p in optim.param_groups[0]["params"]} == {steps}


def test_num_minibatches_needs_one_learner():
    config = _config(PPOConfig, "CartPole-v1", num_minibatches=4).learners(num_learners=2)
    with pytest.raises(ValueError, match=r"num_minibatches=4 needs one learner.*Fix"):
        config.validate()


@pytest.mark.parametrize(("sequences", "steps_per_epoch"), [(12, 4), (4097, 4)])
def test_num_minibatches_on_a_sequence_batch(sequences, steps_per_epoch):
    """A batch RLlib slices by sequence: minibatches of ceil(sequences / N) sequences, so an
    epoch has N of them (4097 sequences: 1,025, not RLlib's rounding down to 1,024 and a fifth)."""
    lens = np.array([3 + i % 5 for i in range(sequences)])
    module_batch = SampleBatch({"obs": np.arange(lens.sum()), SampleBatch.SEQ_LENS: lens})
    module_batch.enable_slicing_by_batch_id()
    batch = MultiAgentBatch({MID: module_batch}, env_steps=int(lens.sum()))
    rllib = MiniBatchCyclicIterator(
        batch, num_epochs=4, minibatch_size=128, shuffle_batch_per_epoch=False
    )
    minibatches = list(with_num_minibatches(rllib, 4))
    assert len(minibatches) == 4 * steps_per_epoch
    assert {len(m.policy_batches[MID][SampleBatch.SEQ_LENS]) for m in minibatches} == {
        -(-sequences // 4)
    }
