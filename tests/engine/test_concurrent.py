"""Independent branches run at once (Net(concurrent=True)): bit-identical to the serial run.

The two directions of a bidirectional layer are chains that meet only at
their Concat; on the CPU a net may run them on two threads. The memory plan
keeps every buffer such a region touches live through all of it, so the
result cannot depend on how the threads interleave.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.net_helpers import host
from unroll import NetError, expand, to_prototxt
from unroll.engine import threads
from unroll.engine.net import Net
from unroll.testing import builtin_templates
from unroll.train.bucketing import cont_from_lengths
from unroll.train.solver import Solver

CELLS = builtin_templates("step")


def bidirectional_net(cell, T, N, layers, D=3, H=4, dtype="float64"):
    text = to_prototxt(expand(cell, steps=T, batch=N, input_dim=D, hidden=H,
                              direction="bidirectional", layers=layers)) + f"""
layer {{ name: "target" type: "Input" top: "target"
        input_param {{ shape {{ dim: {T} dim: {N} dim: {2 * H} }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }}
"""
    return "force_backward: true\n" + text


def train(text, concurrent, feeds, dtype="float64"):
    net = Net(text, dtype=dtype, concurrent=concurrent, seed=3)
    solver = Solver(net, type="Adam", base_lr=0.01, momentum=0.9, momentum2=0.999)
    grads = []
    for feed in feeds:
        solver.step(1, feed=lambda _, feed=feed: feed)
        grads.append({p.name: host(p.blob.diff).copy() for p in net.learnable_params})
    out = net.forward(**feeds[-1])
    net.backward()
    return net, {k: host(v) for k, v in out.items()}, host(net.blobs["x"].diff), grads


@settings(max_examples=10, deadline=None)
@given(cell=st.sampled_from(CELLS), layers=st.integers(1, 2), T=st.integers(2, 6),
       lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       dtype=st.sampled_from(["float32", "float64"]))
def test_the_concurrent_schedule_is_bit_identical_to_the_serial_one(cell, layers, T, lengths,
                                                                    dtype):
    lengths = [min(n, T) for n in lengths]
    N = len(lengths)
    text = bidirectional_net(cell, T, N, layers)
    rng = np.random.default_rng(T * 10 + N)
    feeds = [dict(x=rng.normal(size=(T, N, 3)), cont=cont_from_lengths(lengths, T),
                  target=rng.normal(size=(T, N, 8))) for _ in range(3)]
    net, out, x_diff, grads = train(text, True, feeds, dtype)
    assert len(net.regions) == layers  # each layer's two directions
    _, want_out, want_x_diff, want_grads = train(text, False, feeds, dtype)
    for k in want_out:
        np.testing.assert_array_equal(out[k], want_out[k])
    np.testing.assert_array_equal(x_diff, want_x_diff)
    for got, want in zip(grads, want_grads):
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_the_tagger_trains_bit_identically_concurrent_and_serial():
    T, lengths = 5, [5, 3, 2]
    text = "force_backward: true\n" + to_prototxt(expand(
        "tagger", steps=T, batch=3, vocab=20, tags=4, embed=5, hidden=3, layers=2,
        features={"suffix": [50, 8]}, dropout=0.0))
    rng = np.random.default_rng(0)
    real = np.arange(T)[:, None] < np.asarray(lengths)[None, :]
    feeds = [dict(words=rng.integers(0, 20, (T, 3)), suffix=rng.integers(0, 50, (T, 3)),
                  cont=cont_from_lengths(lengths, T),
                  labels=np.where(real, rng.integers(0, 4, (T, 3)), -1)) for _ in range(3)]
    results = []
    for concurrent in (True, False):
        net = Net(text, dtype="float64", concurrent=concurrent)
        solver = Solver(net, type="Adam", base_lr=0.01, momentum=0.9, momentum2=0.999)
        for feed in feeds:
            solver.step(1, feed=lambda _, feed=feed: feed)
        results.append((len(net.regions), host(net.store.data).copy()))
    assert results[0][0] == 2 and results[1][0] == 0
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_branches_that_draw_random_numbers_or_share_a_param_stay_serial():
    branch = """
layer {{ name: "ip{k}_{i}" type: "InnerProduct" bottom: "{src}" top: "b{k}_{i}"
        param {{ name: "{W}" }} inner_product_param {{ num_output: 3 bias_term: false }} }}"""

    def net_text(shared: bool, dropout: bool):
        text = """force_backward: true
layer { name: "in" type: "Input" top: "x" top: "t"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 6 } } }"""
        for k in range(2):
            src = "x"
            for i in range(10):
                text += branch.format(k=k, i=i, src=src, W="W" if shared else f"W{k}_{i}")
                src = f"b{k}_{i}"
            if dropout and k == 1:
                text += f"""
layer {{ name: "drop" type: "Dropout" bottom: "{src}" top: "{src}" }}"""
        return text + """
layer { name: "cat" type: "Concat" bottom: "b0_9" bottom: "b1_9" top: "y" }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }"""

    assert len(Net(net_text(False, False), concurrent=True).regions) == 1
    assert Net(net_text(True, False), concurrent=True).regions == []
    assert Net(net_text(False, True), concurrent=True).regions == []
    assert Net(net_text(False, False), concurrent=True, device="trace").regions == []


@pytest.mark.parametrize("free", [1, 2])  # the regions run serially, or on branch threads
def test_a_failure_on_a_branch_thread_names_the_layer(free):
    threads.set_num_threads(free)
    try:
        fails_naming_the_layer()
    finally:
        threads.set_num_threads(None)


def fails_naming_the_layer():
    text = bidirectional_net("lstm", 4, 2, 1)
    net = Net(text, concurrent=True)
    assert net.regions
    feed = dict(x=np.zeros((4, 2, 3)), cont=np.ones((4, 2)), target=np.zeros((4, 2, 8)))
    net.forward(**feed)
    victim = net.regions[0].branches[1][3]
    layer = net.layers_run[victim]

    def broken(*args):
        raise ValueError("boom")

    layer.forward = broken
    with pytest.raises(NetError,
                       match=f"layer '{layer.name}'.*failed in forward: ValueError: boom"):
        net.forward(**feed)
