"""BLAS threads per net run: the policy's count inside the run, the pool's own after it;
results that do not depend on the count (docs/design.md, section 4)."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_info

from unroll import Net, expand, to_prototxt
from unroll.engine import threads
from unroll.engine.layer import Layer, register_layer
from unroll.testing import builtin_templates

SEEN: list[int] = []
THREADS: set[int] = set()  # the Python threads the recorders ran on


@register_layer("TestRecordBlasThreads")
class RecordBlasThreads(Layer):
    """y = x; records the BLAS pool size it runs under."""

    in_place = True
    backward_reads = ()

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)

    def forward(self, bottoms, tops):
        SEEN.append(blas_threads())
        THREADS.add(threading.get_ident())
        tops[0].data[...] = bottoms[0].data

    def backward(self, tops, propagate_down, bottoms):
        SEEN.append(blas_threads())
        if propagate_down[0]:
            bottoms[0].diff[...] = tops[0].diff


NET = '''
  layer { name: "in" type: "Input" top: "x" top: "t"
          input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
  layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
          inner_product_param { num_output: 2 } }
  layer { name: "rec" type: "TestRecordBlasThreads" bottom: "y" top: "z" }
  layer { name: "loss" type: "EuclideanLoss" bottom: "z" bottom: "t" top: "l" }'''


def chain(x: str, n: int) -> str:
    """``n`` TanH layers after ``x``, then a recorder; its top is ``x`` + "_rec"."""
    text, prev = "", x
    for i in range(n):
        text += f'layer {{ name: "{x}{i}" type: "TanH" bottom: "{prev}" top: "{x}{i}" }}\n'
        prev = f"{x}{i}"
    return text + (f'layer {{ name: "{x}_rec" type: "TestRecordBlasThreads" bottom: "{prev}" '
                   f'top: "{x}_rec" }}\n')


#: two chains from one split that meet only at the concat: a region of two branches
BRANCHES = ('''
  layer { name: "in" type: "Input" top: "x" top: "t"
          input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 4 } } }
  layer { name: "ipa" type: "InnerProduct" bottom: "x" top: "a"
          inner_product_param { num_output: 2 } }
  layer { name: "ipb" type: "InnerProduct" bottom: "x" top: "b"
          inner_product_param { num_output: 2 } }''' + chain("a", 8) + chain("b", 8) + '''
  layer { name: "cat" type: "Concat" bottom: "a_rec" bottom: "b_rec" top: "c" }
  layer { name: "loss" type: "EuclideanLoss" bottom: "c" bottom: "t" top: "l" }''')


def blas_threads() -> int:
    return min(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")


def run(net) -> list[int]:
    SEEN.clear()
    THREADS.clear()
    net.forward(x=np.ones((4, 3)), t=np.zeros(net.blobs["t"].shape))
    net.backward()
    return list(SEEN)


@pytest.fixture
def policy():
    """Leaves the policy as it found it."""
    yield threads
    threads.set_num_threads(None)


@pytest.fixture
def net():
    return Net(NET)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_fixed_count_is_the_pool_inside_every_run_and_the_old_pool_after(policy, net, n):
    before = blas_threads()
    policy.set_num_threads(n)
    assert run(net) == [n, n]
    assert blas_threads() == before


def test_a_run_on_another_python_thread_gets_the_policys_count_too(policy, net):
    # the first thread to set the pool (threadpoolctl's "controlling" thread) is alive
    policy.set_num_threads(1)
    assert run(net) == [1, 1]
    policy.set_num_threads(3)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(run(net)))
    worker.start()
    worker.join()
    assert seen == [[3, 3]]


def test_the_environment_variable_fixes_the_count(policy, net, monkeypatch):
    monkeypatch.setenv(threads.ENV, "1")
    assert run(net) == [1, 1]
    monkeypatch.setenv(threads.ENV, "two")
    with pytest.raises(ValueError, match="UNROLL_NUM_THREADS must be an integer >= 1"):
        run(net)


@pytest.mark.parametrize(("cores", "others", "want"),
                         [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 2.0, 1), (8, 3.2, 5),
                          (1, 0.0, 1)])
def test_measured_policy_leaves_the_cores_others_keep_busy(policy, net, monkeypatch, cores,
                                                           others, want):
    monkeypatch.setattr(threads, "cores", lambda: cores)
    monkeypatch.setattr(threads, "others_busy", lambda: others)
    assert threads.num_threads() == want
    assert run(net) == [want, want]


def test_the_load_is_measured_from_the_machine(policy):
    # a real measurement: a number of cores' worth between none and all of them
    # the busy time of this process's own cores only, less its own: the counters tick in
    # 10 ms units, so a second's measurement is off by a few hundredths at most
    assert 0.0 <= threads.others_busy() <= threads.cores() + 0.05
    assert 1 <= threads.num_threads() <= threads.cores()


def test_concurrent_branches_run_with_one_blas_thread_each(policy):
    policy.set_num_threads(2)
    serial, concurrent = Net(BRANCHES), Net(BRANCHES, concurrent=True)
    assert concurrent.regions and not serial.regions
    assert run(serial) == [2] * 4 and THREADS == {threading.get_ident()}
    assert run(concurrent) == [1] * 4 and len(THREADS) == 2


def test_with_one_free_core_the_branches_run_in_the_serial_order(policy):
    policy.set_num_threads(1)
    serial = Net(BRANCHES, dtype="float64", keep=["c"])
    concurrent = Net(BRANCHES, dtype="float64", keep=["c"], concurrent=True)
    concurrent.copy_from(serial.to_proto())
    assert run(concurrent) == [1] * 4 and THREADS == {threading.get_ident()}
    want, got = run_both(serial), run_both(concurrent)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def run_both(net) -> list:
    net.forward(x=np.linspace(-1, 1, 12).reshape(4, 3), t=np.zeros((4, 4)))
    net.backward()
    return [net.blobs["c"].data.copy(), *(p.diff.copy() for p in net.learnable_params)]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_a_bad_count_is_refused(policy, bad):
    with pytest.raises(ValueError, match="integer >= 1"):
        policy.set_num_threads(bad)


class Counters:
    """psutil as _Load reads it: per-core busy seconds and this process's own, scripted."""

    def __init__(self, cores: int):
        self.busy = [0.0] * cores
        self.own = 0.0

    def cpu_times(self, percpu):
        from types import SimpleNamespace

        return [SimpleNamespace(user=b, system=0.0) for b in self.busy]

    def Process(self):  # noqa: N802  (psutil's name)
        from types import SimpleNamespace

        return SimpleNamespace(cpu_times=lambda: SimpleNamespace(user=self.own, system=0.0))


@pytest.mark.parametrize(("busy", "own", "want"),
                         # the first interval (150 ms); a tick is 10 ms
                         [((0.02, 0.01), 0.0, 2),
                          # another process on a whole core, a tick more or less
                          ((0.01, 0.16), 0.0, 1),
                          ((0.0, 0.14), 0.0, 1),
                          # a tick on each of 8 idle cores: 0.53 cores' worth nobody used
                          ((0.01,) * 8, 0.0, 8),
                          ((0.15,) + (0.01,) * 7, 0.0, 7)])
def test_the_counters_rounding_is_not_taken_for_another_process(policy, monkeypatch, busy, own,
                                                                 want):
    import sys

    counters = Counters(len(busy))
    monkeypatch.setitem(sys.modules, "psutil", counters)
    monkeypatch.setattr(threads, "_allowed", lambda: list(range(len(busy))))
    then = 100.0 + threads.FIRST_INTERVAL
    clock = iter([100.0, then, then])
    monkeypatch.setattr(threads.time, "monotonic", lambda: next(clock))

    def sleep(seconds):  # the first interval: the scripted counters move
        assert seconds == threads.FIRST_INTERVAL
        counters.busy, counters.own = list(busy), own

    monkeypatch.setattr(threads.time, "sleep", sleep)
    monkeypatch.setattr(threads, "TICK", 0.01)
    load = threads._Load()
    monkeypatch.setattr(threads, "_load", lambda: load)
    assert threads.num_threads() == want


def test_every_change_of_the_environment_variable_counts_from_the_next_run(policy, net,
                                                                           monkeypatch):
    for value, want in [("2", 2), ("1", 1), ("3", 3), ("1", 1)]:
        monkeypatch.setenv(threads.ENV, value)
        assert run(net) == [want, want]
    monkeypatch.setenv(threads.ENV, "0")
    for _ in range(2):  # refused on every run, not only where it was first read
        with pytest.raises(ValueError, match=r"UNROLL_NUM_THREADS must be an integer >= 1, "
                                             r"found '0'"):
            run(net)
    monkeypatch.delenv(threads.ENV)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads, "others_busy", lambda: 0.0)
    assert run(net) == [2, 2]


class Pool:
    """A BLAS library as _blas gives it: its count, and every count set on it."""

    def __init__(self, n: int):
        self.n, self.puts = n, []

    def get(self) -> int:
        return self.n

    def put(self, n: int) -> None:
        self.puts.append(n)
        self.n = n


@pytest.mark.parametrize("sizes", [(1,), (2,), (1, 2), (2, 2), (3, 1, 2)])
def test_a_run_sets_only_the_pools_not_at_its_count_and_restores_only_those(sizes,
                                                                            monkeypatch):
    pools = [Pool(n) for n in sizes]
    monkeypatch.setattr(threads, "_blas", lambda: tuple((p.get, p.put) for p in pools))
    with threads.run_threads(2) as n:
        assert n == 2 and [p.n for p in pools] == [2] * len(pools)
    assert [p.n for p in pools] == list(sizes)
    assert [p.puts for p in pools] == [[] if n == 2 else [2, n] for n in sizes]


def unrolled_net(cell, direction, layers, dtype, T, N, D, H) -> Net:
    unrolled = expand(cell, steps=T, batch=N, input_dim=D, hidden=H, direction=direction,
                      layers=layers)
    out = 2 * H if direction == "bidirectional" else H
    text = "force_backward: true\n" + to_prototxt(unrolled) + f"""
layer {{ name: "target" type: "Input" top: "target"
        input_param {{ shape {{ dim: {T} dim: {N} dim: {out} }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }}
"""
    return Net(text, dtype=dtype, seed=7, keep=("x", "h"))


def results(net, n, feed) -> list:
    """The loss, the output, the input's and every parameter's gradient at ``n`` threads."""
    threads.set_num_threads(n)
    net.clear_param_diffs()
    net.forward(**feed)
    net.backward()
    return [net.loss, net.blobs["h"].data.copy(), net.blobs["x"].diff.copy(),
            *(p.diff.copy() for p in net.learnable_params)]


def assert_same_bits(one, two) -> None:
    assert one[0] == two[0]
    for a, b in zip(one[1:], two[1:]):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(cell=st.sampled_from(builtin_templates("step")),
       direction=st.sampled_from(["forward", "bidirectional"]), layers=st.integers(1, 2),
       dtype=st.sampled_from(["float32", "float64"]), T=st.integers(1, 4), N=st.integers(1, 9),
       H=st.integers(1, 12), seed=st.integers(0, 2**16), data=st.data())
def test_one_and_two_threads_give_the_same_bits(policy, cell, direction, layers, dtype, T, N, H,
                                                seed, data):
    rng = np.random.default_rng(seed)
    D = 3
    net = unrolled_net(cell, direction, layers, dtype, T, N, D, H)
    # sequences packed back to back: a 0 starts one, anywhere in a column
    cont = np.array(data.draw(st.lists(st.lists(st.sampled_from([0, 1]), min_size=N,
                                                max_size=N), min_size=T, max_size=T)), float)
    cont[0] = 0
    out = net.blobs["target"].shape[-1]
    feed = dict(x=rng.normal(size=(T, N, D)), cont=cont, target=rng.normal(size=(T, N, out)))
    assert_same_bits(results(net, 1, feed), results(net, 2, feed))


def test_a_net_whose_gemms_are_threaded_keeps_its_bits(policy):
    # 32 rows of 512: large enough that the BLAS splits each GEMM over both threads
    net = unrolled_net("lstm", "forward", 1, "float32", 3, 32, 5, 512)
    rng = np.random.default_rng(0)
    feed = dict(x=rng.normal(size=(3, 32, 5)), cont=np.ones((3, 32)),
                target=rng.normal(size=(3, 32, 512)))
    assert_same_bits(results(net, 1, feed), results(net, 2, feed))
