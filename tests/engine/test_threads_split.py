"""Results do not depend on the thread count (docs/design.md, section 4): an unrolled net
gives the same loss, outputs and gradients bit for bit at one BLAS thread and at two, with
the recurrent units' rows split over the run's pool (UNROLL_SPLIT_ROWS=1) and without,
for every built-in cell, stacked, bidirectional and with sequences packed back to back
(cont 0 inside a column), float32 and float64. The tests lower the split's size bound
so that the small nets here split."""

import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unroll import Net, expand, to_prototxt
from unroll.engine import threads
from unroll.engine.layer import Layer, register_layer
from unroll.testing import builtin_templates

CELLS = builtin_templates("step")


def build(cell, direction, layers, dtype, T, N, D, H):
    unrolled = expand(cell, steps=T, batch=N, input_dim=D, hidden=H, direction=direction,
                      layers=layers)
    out = 2 * H if direction == "bidirectional" else H
    text = "force_backward: true\n" + to_prototxt(unrolled) + f"""
layer {{ name: "target" type: "Input" top: "target"
        input_param {{ shape {{ dim: {T} dim: {N} dim: {out} }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }}
"""
    return Net(text, dtype=dtype, seed=7, keep=("x", "h"))


def run(net, n, feed):
    threads.set_num_threads(n)
    net.clear_param_diffs()
    net.forward(**feed)
    net.backward()
    return [net.loss, net.blobs["h"].data.copy(), net.blobs["x"].diff.copy(),
            *(p.diff.copy() for p in net.learnable_params)]


@pytest.fixture
def split(monkeypatch):
    """The row split on, for blocks of any size; the policy left as found."""
    monkeypatch.setenv(threads.SPLIT, "1")
    monkeypatch.setattr(threads, "SPLIT_MIN", 1)
    yield
    threads.set_num_threads(None)


@settings(max_examples=40, deadline=None)
@given(cell=st.sampled_from(CELLS), direction=st.sampled_from(["forward", "bidirectional"]),
       layers=st.integers(1, 2), dtype=st.sampled_from(["float32", "float64"]),
       T=st.integers(1, 4), N=st.integers(1, 9), H=st.integers(1, 12), rows=st.booleans(),
       seed=st.integers(0, 2**16), data=st.data())
def test_one_and_two_threads_give_the_same_bits(split, cell, direction, layers, dtype, T, N,
                                                H, rows, seed, data):
    os.environ[threads.SPLIT] = "1" if rows else "0"  # the fixture restores it
    rng = np.random.default_rng(seed)
    D = 3
    net = build(cell, direction, layers, dtype, T, N, D, H)
    # sequences packed back to back: a 0 starts one, anywhere in a column
    cont = np.array(data.draw(st.lists(st.lists(st.sampled_from([0, 1]), min_size=N,
                                                max_size=N), min_size=T, max_size=T)), float)
    cont[0] = 0
    out = net.blobs["target"].shape[-1]
    feed = dict(x=rng.normal(size=(T, N, D)), cont=cont, target=rng.normal(size=(T, N, out)))
    one, two = run(net, 1, feed), run(net, 2, feed)
    assert one[0] == two[0]
    for a, b in zip(one[1:], two[1:]):
        np.testing.assert_array_equal(a, b)


def test_a_large_net_splits_its_units_and_keeps_its_bits(split, monkeypatch):
    # the split's own size bound: 32 rows of 512 split in two
    monkeypatch.setattr(threads, "SPLIT_MIN", 8192)
    calls = []
    split_rows = threads.split_rows
    monkeypatch.setattr(
        "unroll.engine.kernels.cpu.split_rows",
        lambda run, rows, ways: calls.append(ways) or split_rows(run, rows, ways))
    net = build("lstm", "forward", 1, "float32", 3, 32, 5, 512)
    rng = np.random.default_rng(0)
    feed = dict(x=rng.normal(size=(3, 32, 5)), cont=np.ones((3, 32)),
                target=rng.normal(size=(3, 32, 512)))
    one = run(net, 1, feed)
    assert calls == []
    two = run(net, 2, feed)
    assert calls == [2] * 6  # 3 steps, forward and backward
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


SEEN: list[int] = []


@register_layer("TestRecordSplitWays")
class RecordSplitWays(Layer):
    """y = x; records the blocks a large kernel would split into where it runs."""

    in_place = True
    backward_reads = ()

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)

    def forward(self, bottoms, tops):
        SEEN.append(threads.split_ways(10**4, 10**4))
        tops[0].data[...] = bottoms[0].data

    def backward(self, tops, propagate_down, bottoms):
        SEEN.append(threads.split_ways(10**4, 10**4))
        if propagate_down[0]:
            bottoms[0].diff[...] = tops[0].diff


def recorder_net(concurrent: bool = False) -> Net:
    def chain(x):
        return "".join(f'layer {{ name: "{x}{i}" type: "TanH" bottom: "{x}{i - 1 if i else ""}" '
                       f'top: "{x}{i}" }}\n' for i in range(6)) + (
            f'layer {{ name: "{x}_rec" type: "TestRecordSplitWays" bottom: "{x}5" '
            f'top: "{x}_rec" }}\n')
    text = '''
  layer { name: "in" type: "Input" top: "x" top: "t"
          input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 6 } } }
  layer { name: "ipa" type: "InnerProduct" bottom: "x" top: "a"
          inner_product_param { num_output: 3 } }
  layer { name: "ipb" type: "InnerProduct" bottom: "x" top: "b"
          inner_product_param { num_output: 3 } }''' + chain("a") + chain("b") + '''
  layer { name: "cat" type: "Concat" bottom: "a_rec" bottom: "b_rec" top: "c" }
  layer { name: "loss" type: "EuclideanLoss" bottom: "c" bottom: "t" top: "l" }'''
    return Net(text, concurrent=concurrent)


def record(net) -> list[int]:
    SEEN.clear()
    net.forward(x=np.ones((4, 3)), t=np.zeros((4, 6)))
    net.backward()
    return list(SEEN)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_split_takes_the_pool_size_the_policy_chose_and_none_after(split, n):
    threads.set_num_threads(n)
    assert record(recorder_net()) == [n] * 4
    assert threads.split_ways(10**4, 10**4) == 1


def test_the_measured_policy_sets_the_split_too(split, monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads, "others_busy", lambda: 1.0)
    assert record(recorder_net()) == [1] * 4
    monkeypatch.setattr(threads, "others_busy", lambda: 0.0)
    assert record(recorder_net()) == [2] * 4


def test_concurrent_branches_do_not_split(split):
    threads.set_num_threads(2)
    assert record(recorder_net(concurrent=True)) == [1] * 4


def test_the_split_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv(threads.SPLIT, raising=False)
    with threads.run_threads(2):
        assert threads.split_ways(10**4, 10**4) == 1


def test_split_rows_raises_a_block_error_after_every_block_is_done():
    done = []
    lock = threading.Lock()

    def run(start, stop):
        with lock:
            done.append(start)
        if start == 0:
            raise ValueError("block 0")

    with pytest.raises(ValueError, match="block 0"):
        threads.split_rows(run, 9, 3)
    assert sorted(done) == [0, 3, 6]
