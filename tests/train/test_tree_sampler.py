"""TreeBucketSampler and TreeModel (docs/design.md, "Unrolling over trees")."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.frontend.test_tree_unroller import CHILD_SUM, trees
from unroll.frontend.tree import Tree, level_widths
from unroll.frontend.tree_unroller import expand_tree, tree_inputs
from unroll.frontend.unroller import load_template
from unroll.train.tree_model import TreeModel
from unroll.train.tree_sampler import TreeBucketSampler, round_width


@given(st.integers(1, 10_000), st.floats(1.05, 2.0))
def test_round_width_rounds_up_onto_a_grid(width, ratio):
    r = round_width(width, ratio)
    assert width <= r <= max(8, width * ratio + 1)
    assert round_width(r, ratio) == r


@settings(max_examples=20, deadline=None)
@given(batch=st.lists(trees(max_height=6, max_extra=5), min_size=1, max_size=12),
       size=st.integers(1, 5), direction=st.sampled_from(["up", "down", "bidirectional"]),
       epoch=st.integers(0, 3), group=st.integers(1, 3))
def test_every_tree_once_in_a_batch_of_one_height_whose_key_holds_it(batch, size, direction,
                                                                       epoch, group):
    s = TreeBucketSampler(batch, batch_size=size, direction=direction, seed=3, group=group)
    batches = s.epoch_batches(epoch)
    keys = s.epoch_keys(epoch)
    assert len(s.keys(epoch)) <= len(batches)
    assert sorted(i for b in batches for i in b) == list(range(len(batch)))
    assert len(batches) == len(s) and batches == s.epoch_batches(epoch)
    slots = real = 0
    for b, key in zip(batches, keys):
        assert 1 <= len(b) <= size
        assert len({int(batch[i].heights().max()) for i in b}) == 1
        for d, widths in (zip(("up", "down"), key) if direction == "bidirectional"
                          else [(direction, key)]):
            got = level_widths([batch[i] for i in b], d)
            assert len(widths) == len(got) and all(w >= g for w, g in zip(widths, got))
            slots += sum(widths)
            real += sum(got)
    assert np.isclose(s.padding_fraction(epoch), 1 - real / slots)


@settings(max_examples=20, deadline=None)
@given(forest=st.lists(trees(max_height=4, max_extra=3), min_size=1, max_size=20),
       batch_size=st.integers(1, 4), size=st.integers(1, 4), epoch=st.integers(0, 2),
       shuffle=st.booleans())
def test_ranks_take_equal_shares_dealt_from_one_epoch(forest, batch_size, size, epoch,
                                                        shuffle):
    def sampler(rank=0, size=1):
        return TreeBucketSampler(forest, batch_size, "bidirectional", seed=5, shuffle=shuffle,
                                 group=2, rank=rank, size=size)

    whole = sampler()
    shares = [sampler(rank, size) for rank in range(size)]
    assert {len(s) for s in shares} == {len(whole) // size}
    dealt = [(b, b.key) for k in range(len(shares[0]))
             for b in (s.epoch_batches(epoch)[k] for s in shares)]
    assert dealt == [(b, b.key) for b in whole.epoch_batches(epoch)][:len(dealt)]
    assert all(s.epoch_keys(epoch) == [b.key for b in s.epoch_batches(epoch)] for s in shares)


def test_a_model_runs_every_bucket_over_one_store_and_workspace():
    rng = np.random.default_rng(0)
    # node i > 0 hangs below a node before it: random shapes, heights 0..5
    forest = [Tree([-1] + [int(rng.integers(max(0, i - 2), i)) for i in range(1, n)])
              for n in rng.integers(1, 7, size=30)]
    sampler = TreeBucketSampler(forest, batch_size=4, seed=0)
    template = load_template(CHILD_SUM)
    model = TreeModel(lambda w: expand_tree(CHILD_SUM, w, input_dim=3, hidden=4), canonical=(1,))
    for batch, key in zip(sampler.epoch_batches(0), sampler.epoch_keys(0)):
        ts = [forest[i] for i in batch]
        rows = sum(key)
        model.forward(widths=key, x=rng.normal(size=(rows, 3)), **tree_inputs(ts, template, key))
    assert len(model.nets) == 1 + len(sampler.keys(0) - {(1,)})
    nets = list(model.nets.values())
    assert all(n.store is model.store for n in nets)
    assert all(n.workspace is model.workspace for n in nets)
    assert len(model.learnable_params) == 6
