"""The trace backend: a NumPy-backed CuPy stand-in that counts launches, syncs and transfers."""

import gc
import math

import numpy as np
import pytest

from examples.pos_tagging.tagger import TaggerConfig
from examples.pos_tagging.workload import packed_step, tagger_setup
from unroll import Net, NetError
from unroll.engine import trace
from unroll.engine.backend import device_of, get_array_module, module_of, to_numpy
from unroll.train import step_counts
from unroll.train.solver import Solver


def test_the_trace_device_is_the_trace_module():
    assert get_array_module("trace") is trace
    assert device_of(trace) == "trace"
    a = trace.zeros((2, 3))
    assert module_of(a) is trace and isinstance(a, trace.ndarray)
    assert isinstance(to_numpy(a), np.ndarray)


def test_operations_launch_views_and_allocations_do_not():
    a = trace.asarray(np.arange(6.0).reshape(2, 3))
    with trace.measure() as c:
        b = trace.empty_like(a)  # allocation
        v = a.reshape(3, 2).T[0]  # views
        trace.multiply(a, 2, out=b)  # one element-wise kernel
        b += a  # one more
        s = (a * b).sum(axis=0)  # product, then reduction
        b[0] = 1.0  # a fill of a row
        m = a.ravel()[[0, 2]]  # a gather (the ravel is a view)
        t = a.T.ravel()  # a copy: not contiguous
    assert (c.launches, c.syncs, c.h2d, c.d2h) == (7, 0, 0, 0)
    assert c.ops == {"multiply": 2, "add": 1, "sum": 1, "__setitem__": 1, "__getitem__": 1,
                     "ravel": 1}
    assert v.shape == (3,) and s.shape == (3,) and m.shape == (2,) and t.shape == (6,)


def test_host_waits_are_syncs():
    a = trace.asarray(np.array([1.0, -2.0, 3.0]))
    with trace.measure() as c:
        float(a.sum())  # a launch and a sync
        if (a > 0).any():  # two launches, one sync (bool)
            pass
        int(a.argmax())  # a launch and a sync
        trace.flatnonzero(a > 0)  # data-dependent shape: two launches, one sync
        a[a > 0]  # boolean mask: comparison, gather, one sync
        a.tolist()  # a device-to-host copy
        host = a.get()
    assert (c.launches, c.syncs, c.d2h) == (8, 7, 2)
    assert c.sync_sites == {"float": 1, "bool": 1, "int": 1, "flatnonzero": 1,
                            "boolean index": 1, "tolist": 1, "get": 1}
    np.testing.assert_array_equal(host, [1.0, -2.0, 3.0])


def test_transfers_and_reductions_give_device_arrays():
    with trace.measure() as c:
        a = trace.asarray([[1.0, 2.0]])  # host data: one transfer
        assert trace.asarray(a) is a  # already there: nothing
        b = trace.asarray(a, np.float32)  # a cast: one launch
        a[...] = np.array([[3.0, 4.0]])  # a host array written in: a transfer and a copy
        total = a.sum()
    assert (c.h2d, c.launches) == (2, 3)
    assert isinstance(total, trace.ndarray) and total.shape == ()
    assert b.dtype == np.float32 and a.get().tolist() == [[3.0, 4.0]]


def test_nested_measures_both_count():
    a = trace.ones(3)
    with trace.measure() as outer:
        a += 1
        with trace.measure() as inner:
            a *= 2
    assert (outer.launches, inner.launches) == (2, 1)


def test_implicit_host_conversions_are_refused_as_in_cupy():
    a = trace.ones((2, 2))
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(a)
    with pytest.raises(TypeError, match=r"multiply was given a NumPy array of shape \(2, 2\)"):
        trace.multiply(a, np.ones((2, 2)))
    with pytest.raises(TypeError, match="NumPy array"):
        a + np.ones(2)
    np.testing.assert_array_equal((np.float64(2) * a).get(), 2 * np.ones((2, 2)))


def test_random_draws_and_custom_kernels_are_one_launch_each():
    rng = trace.random.default_rng(0)
    double = trace.custom_kernel(lambda x: x * 2, "double")
    with trace.measure() as c:
        x = rng.random((3, 4))
        y = double(x)
    assert c.ops == {"random.random": 1, "double": 1}
    np.testing.assert_array_equal(y.get(), 2 * x.get())
    again = trace.random.default_rng(0).random((3, 4))
    np.testing.assert_array_equal(again.get(), x.get())


def test_new_buffers_are_counted_and_live_bytes_follow_them():
    a = trace.zeros((2, 3))  # float64: 48 bytes
    gc.collect()
    gc.disable()  # no other test's garbage freed in between
    try:
        with trace.measure() as c:
            before = trace.live_bytes()
            b = a * 2  # a new buffer
            v = b.reshape(3, 2)[0]  # views of it: nothing new
            a += b  # in place: nothing new
            s = a.sum()  # a 0-d result: 8 bytes
            grown = trace.live_bytes() - before
            del b, s
            after = trace.live_bytes() - before
        del v
        gone = trace.live_bytes() - before
    finally:
        gc.enable()
    assert (c.allocations, c.allocated_bytes) == (2, 56)
    assert (grown, after, gone) == (56, 48, 0)  # v held b's buffer until it went


def test_a_capture_replays_its_launches_on_the_buffers_of_the_capture():
    x = trace.asarray(np.array([1.0, 2.0]))
    y = trace.empty_like(x)
    with trace.capture() as graph:
        t = x * 3  # a temporary: the replay writes into the same buffer
        trace.add(t, 1, out=y)
        y[0] = 0  # a fill with the capture's value
    x[...] = trace.asarray(np.array([10.0, 20.0]))
    with trace.measure() as c:
        graph.launch()
    assert y.get().tolist() == [0.0, 61.0] and t.get().tolist() == [30.0, 60.0]
    assert c.launches == 1 and c.ops == {"graph.launch": 1}
    for read in (lambda: float(x.sum()), lambda: x.get(), lambda: trace.asarray([1.0])):
        with pytest.raises(trace.CaptureError), trace.capture():
            read()


TINY = """
layer { name: "in" type: "Input" top: "x" top: "t"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "l" }
"""


def test_a_tiny_nets_step_is_counted_exactly():
    net = Net(TINY, device="trace")
    solver = Solver(net, type="SGD", base_lr=0.1)
    inputs = {"x": np.ones((4, 3)), "t": np.zeros((4, 2))}
    solver.step(1, feed=inputs)  # allocates the diffs and the history
    counts = step_counts.count_step(net, solver, inputs)
    got = {k: (c.launches, c.syncs, c.h2d, c.d2h) for k, c in counts.items()}
    assert got == {
        # host arrays, handed over as they are: forward sends them
        "inputs": (0, 0, 0, 0),
        # W.diff and b.diff filled with 0
        "clear": (2, 0, 0, 0),
        # x and t, host arrays: a transfer and a copy each; ip: matmul, bias add; loss:
        # subtract, vdot, divide, write the top. Nobody reads the loss: no sum, no sync
        "forward": (8, 0, 2, 0),
        # top diff filled with the loss weight; loss: scale, multiply (t needs no gradient);
        # ip: gy.T @ x, add into W.diff, sum over rows, add into b.diff (x needs none)
        "backward": (7, 0, 0, 0),
        # no non-finite check (no policy), nothing read back; SGD once over the flat
        # buffers (W and b are adjacent): h *= momentum, rate * diff, h += that,
        # diff[...] = h, data -= diff
        "update": (5, 0, 0, 0),
    }


# The GPU budget of a training step (docs/design.md, 4. Devices), held at the counts measured
# last: a change that adds launches, syncs or transfers to a training step fails here; lower
# the bounds when work cuts them.
# The tagger's step is the training command's: one packed transfer of the batch, and one
# sync, the solver's non-finite check (the character Scatter's positions are checked on the
# host, before the transfer); the targets were 1200 launches, 2 syncs, 1 transfer.
TAGGER_BUDGET = {"launches": 1106, "syncs": 1, "h2d": 1, "d2h": 0}
LSTM_BUDGET = {"launches": 221, "syncs": 0, "h2d": 3, "d2h": 0}


@pytest.mark.parametrize("setup, budget", [
    (tagger_setup, TAGGER_BUDGET),
    (step_counts.lstm_setup, LSTM_BUDGET),
])
def test_a_training_step_stays_within_its_gpu_budget(setup, budget):
    counts = step_counts.traced_step(setup).values()
    spent = {k: sum(getattr(c, k) for c in counts) for k in budget}
    over = {k: f"{spent[k]} > {budget[k]}" for k in budget if spent[k] > budget[k]}
    assert not over, f"{setup.__name__} is over its GPU budget: {over}"


# The training command on a GPU replays each batch shape's gradient pass as a CUDA graph
# (docs/design.md, 4. Devices): its step is then the graph, the copies of the batch's inputs
# into the graph's buffers, the non-finite check and the update, whatever the row length
# (eager, the default tagger's step grows with T: 947 launches at T=16, 5,523 at T=159).
# The launches depend on the layers, not on their sizes, so a small tagger of the default's
# layers counts what the default one does.
GRAPHED_STEP_BUDGET = {"launches": 60, "syncs": 1, "h2d": 1, "d2h": 0}
SMALL_TAGGER = dict(embed=8, hidden=8, batch=4, chars={"embed": 4, "hidden": 4, "length": 16})


def test_the_training_commands_graphed_step_makes_as_many_launches_at_every_row_length():
    config = TaggerConfig(**SMALL_TAGGER)
    spent = {T: packed_step(T, config) for T in (16, 32, 64, 159)}
    for T, counts in spent.items():
        got = {k: getattr(counts, k) for k in GRAPHED_STEP_BUDGET}
        over = {k: f"{got[k]} > {v}" for k, v in GRAPHED_STEP_BUDGET.items() if got[k] > v}
        assert not over, f"the training step at T={T} is over its budget with graphs: {over}"
        assert counts.ops["graph.launch"] == 1 and counts.sync_sites == {"float": 1}
    assert len({counts.launches for counts in spent.values()}) == 1, {
        T: counts.launches for T, counts in spent.items()}


def test_the_training_command_replays_graphs_only_on_devices_that_have_them():
    from examples.pos_tagging.train import TrainOptions, training_solver
    from unroll.engine.cuda_graph import StepGraphs

    options = TrainOptions(data=None, model_dir=None)
    for device, graphs in (("trace", StepGraphs), ("cpu", type(None))):
        tagger, _, _ = tiny_tagger(device)
        solver = training_solver(tagger.train_model, options, steps_per_epoch=10)
        assert isinstance(solver.graphs, graphs), device


# -- what a step reads back, and when --------------------------------------------------------


def test_the_loss_is_read_back_only_when_asked_for_once_per_forward():
    net = Net(TINY, device="trace")
    inputs = {"x": np.ones((4, 3)), "t": np.zeros((4, 2))}
    with trace.measure() as c:
        net.forward(**inputs)
    assert c.syncs == 0
    with trace.measure() as c:
        loss, again = net.loss, net.loss
    assert c.syncs == 1 and loss == again
    cpu = Net(TINY)
    cpu.forward(**inputs)
    assert loss == cpu.loss and isinstance(loss, float)
    net.forward(x=2 * np.ones((4, 3)), t=np.zeros((4, 2)))
    assert net.loss != loss  # a new forward, a new loss


def test_the_solver_reads_one_loss_per_step_call_and_its_average_on_demand():
    net = Net(TINY, device="trace")
    solver = Solver(net, type="SGD", base_lr=0.1, average_loss=2, clip_gradients=0.5)
    inputs = {"x": np.ones((4, 3)), "t": np.zeros((4, 2))}
    solver.step(1, feed=inputs)
    with trace.measure() as c:
        last = solver.step(3, feed=inputs)
    assert c.syncs == 1 and isinstance(last, float)
    cpu = Solver(Net(TINY), type="SGD", base_lr=0.1, average_loss=2, clip_gradients=0.5)
    assert cpu.step(4, feed=inputs) == last
    with trace.measure() as c:
        assert solver.loss == cpu.loss
    assert c.syncs == 1


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3, np.inf])
def test_clipping_on_the_device_has_the_bits_of_the_host_formula(scale):
    """diff *= clip / max(norm, clip), computed on the device, against Caffe's host form."""
    net = Net(TINY, device="trace", dtype="float32")
    solver = Solver(net, type="SGD", base_lr=0.1, clip_gradients=1.0)
    solver.step(1, feed={"x": np.ones((4, 3)), "t": np.zeros((4, 2))})
    diff = np.random.default_rng(1).normal(size=net.store.diff.shape).astype(np.float32) * scale
    if not np.isfinite(scale):
        diff[0] = np.nan  # a NaN norm scales nothing, as Caffe's `norm > clip` test
    net.store.diff[...] = diff
    with trace.measure() as c:
        solver.clip_gradients()
    norm = math.sqrt(float(diff @ diff))
    want = diff * np.float32(1.0 / norm) if norm > 1.0 else diff
    np.testing.assert_array_equal(to_numpy(net.store.diff), want)
    assert c.syncs == 0


def test_a_device_array_of_the_nets_dtype_is_taken_without_a_copy():
    net = Net(TINY, device="trace")
    x = trace.ones((4, 3), np.float32)
    with trace.measure() as c:
        net.set_input("x", x)
    assert net.blobs["x"].data is x and c.launches == 0 and c.h2d == 0
    net.set_input("x", np.zeros((4, 3)))  # host data: copied into the net's own array
    assert net.blobs["x"].data is not x and (x.get() == 1).all()
    net.set_input("x", trace.ones((5, 3), np.float64))  # another dtype: copied, in the net's
    assert net.blobs["x"].data.dtype == np.float32 and net.blobs["x"].shape == (5, 3)
    in_place = Net(TINY + """
layer { name: "relu" type: "ReLU" bottom: "x" top: "x" }""", device="trace")
    in_place.set_input("x", x)  # x has a second version: a layer writes over it
    assert in_place.blobs["x@0"].data is not x


def tiny_tagger(device):
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.tagger import Tagger, TaggerConfig, tag_ids
    from unroll.tools.conllu import UPOS_TAGS

    sentences = [["The", "cat", "sat", "."], ["Dogs", "run", "!"]]
    tags = [[UPOS_TAGS[i % len(UPOS_TAGS)] for i in range(len(s))] for s in sentences]
    config = TaggerConfig(embed=4, hidden=3, batch=2, feature_dims={"suffix2": 2},
                          chars={"embed": 2, "hidden": 2, "length": 5})
    tagger = Tagger(Featurizer.build(sentences), config, device=device)
    return tagger, tagger.encode(sentences), tag_ids(tags)


def test_a_tagger_batch_goes_to_the_device_in_one_transfer():
    tagger, encoded, labels = tiny_tagger("trace")
    with trace.measure() as c:
        inputs = tagger.inputs(encoded, 4, labels)
    assert (c.h2d, c.syncs) == (1, 0)
    assert {type(v) for v in inputs.values()} == {trace.ndarray}
    host = tagger.host_inputs(encoded, 4, labels)
    assert set(inputs) == set(host)
    for name, value in host.items():
        np.testing.assert_array_equal(to_numpy(inputs[name]), value)
    with trace.measure() as c:
        tagger.train_model.forward(**inputs)
    # no transfer, nothing read back: every value was checked on the host
    assert (c.h2d, c.syncs) == (0, 0)
    encoded[1]["suffix2"] = encoded[1]["suffix2"] + 1000  # an id past the vocabulary
    with pytest.raises(NetError, match=r"layer 'suffix2_embed' \(Embed\): bottom 'suffix2'"):
        tagger.inputs(encoded, 4, labels)


def spoil_character_positions(monkeypatch, tagger, spoil):
    """Make ``tagger``'s batches carry ``spoil(positions)`` as their character positions."""
    host_inputs = tagger.host_inputs

    def spoiled(*args, **kwargs):
        inputs = host_inputs(*args, **kwargs)
        spoil(inputs["chars_at"].reshape(-1))
        return inputs

    monkeypatch.setattr(tagger, "host_inputs", spoiled)


def test_a_tagger_batch_with_a_repeated_character_position_stops_before_its_transfer(
        monkeypatch):
    tagger, encoded, labels = tiny_tagger("trace")

    def repeat(at):
        kept = np.flatnonzero(at >= 0)
        at[kept[1]] = at[kept[0]]

    spoil_character_positions(monkeypatch, tagger, repeat)
    with trace.measure() as c, pytest.raises(
            NetError, match=r"layer 'char_vec' \(Scatter\): bottom 'chars_at' names cell \d+ "
                            r"more than once"):
        tagger.inputs(encoded, 4, labels)
    assert (c.h2d, c.syncs) == (0, 0)


def test_a_tagger_batch_with_a_character_position_past_the_grid_stops_unread(monkeypatch):
    tagger, encoded, labels = tiny_tagger("trace")

    def past_the_grid(at):
        at[np.flatnonzero(at >= 0)[-1]] = 4 * 2  # the (T, N) = (4, 2) grid has 8 cells

    spoil_character_positions(monkeypatch, tagger, past_the_grid)
    inputs = tagger.inputs(encoded, 4, labels)
    with trace.measure() as c, pytest.raises(
            NetError, match=r"layer 'char_vec' \(Scatter\): bottom 'chars_at' holds 8.0 at index "
                            r"\(\d+, \d+\); expected -1 or an integer in \[0, 8\) \(a cell of "
                            r"'words\w*' \(4, 2\)\)"):  # a split of 'words'
        tagger.train_model.forward(**inputs)
    assert c.syncs == 0


def test_a_packed_tagger_step_sends_its_batch_in_one_transfer():
    from examples.pos_tagging.packing import packed_inputs

    tagger, encoded, labels = tiny_tagger("trace")
    solver = Solver(tagger.train_model, type="SGD", base_lr=0.1)

    def feed(k):  # both sentences (4 and 3 words) back to back in one row of 7
        return packed_inputs(tagger, encoded, [[0, 1]], 7, labels, train=True)[0]

    solver.step(1, feed=feed)
    counts = step_counts.count_step(tagger.train_model, solver, feed)
    assert [counts[phase].h2d for phase in step_counts.PHASES] == [1, 0, 0, 0, 0]
    assert to_numpy(feed(0)["cont"])[:, 0].tolist() == [0, 1, 1, 1, 0, 1, 1]


def test_the_non_finite_check_reads_one_number_per_step():
    tagger, encoded, labels = tiny_tagger("trace")
    solver = Solver(tagger.train_model, type="Adam", base_lr=1e-3, momentum=0.9,
                    momentum2=0.999, clip_gradients=5.0, nonfinite="skip", max_skipped=1)
    inputs = tagger.inputs(encoded, 4, labels, train=True)
    solver.step(1, feed=inputs)
    with trace.measure() as c:
        loss = solver.step(1, feed=inputs)
    # the check reads one number (float), the step's loss, and nothing else is read back
    assert c.sync_sites == {"float": 1} and not solver.skipped
    assert loss == tagger.train_model.loss
    tagger.train_model.store.data[0] = np.nan  # a NaN weight: gradient and loss go NaN
    before = to_numpy(tagger.train_model.store.data).copy()
    solver.step(1, feed=inputs)
    assert [s.iter for s in solver.skipped] == [2] and math.isnan(solver.skipped[0].gradient_norm)
    np.testing.assert_array_equal(to_numpy(tagger.train_model.store.data), before)
