"""CUDA graphs of training steps: replays must give the eager steps' numbers, and what a
graph cannot hold is refused. The tests that take ``device`` run on the trace backend's
simulated capture (bit for bit) and, marked ``gpu``, on CuPy's where a device exists."""


import numpy as np
import pytest

import unroll
from examples.pos_tagging.workload import packed_tagger, tagger_setup
from tests.engine.test_trace import SMALL_TAGGER, TINY
from unroll import Net
from unroll.engine import trace
from unroll.engine.backend import GPU_AVAILABLE, to_numpy
from unroll.engine.cuda_graph import GraphError, StepGraphs, check_capturable
from unroll.train.bucketed_model import BucketedModel
from unroll.train.solver import Solver, SolverError
from unroll.train.step_counts import lstm_setup


@pytest.fixture(params=["trace", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request):
    if request.param == "gpu" and not GPU_AVAILABLE:
        pytest.skip("no GPU: CuPy's stream capture runs only where a CUDA device is present")
    return request.param


def small_lstm(device):
    return lstm_setup(device, T=4, N=3, D=5, H=6)


def small_tagger(device):
    return tagger_setup(device, T=6, N=4)


def params(model):
    return to_numpy(model.store.data).copy()


@pytest.mark.parametrize("setup", [small_lstm, small_tagger])
def test_replays_give_the_eager_steps(device, setup):
    eager, eager_solver, feed, _ = setup(device)
    model, solver, graph_feed, _ = setup(device)
    solver.graphs = StepGraphs(model, warmup=2)
    # the same kernels in the same order: the same bits, but for the order of a GPU's
    # atomic adds (the tagger's embedding gradients)
    rtol = 0 if device == "trace" else 1e-5
    for k in range(6):
        want = eager_solver.step(1, feed=feed)
        got = solver.step(1, feed=graph_feed)
        np.testing.assert_allclose(got, want, rtol=rtol, err_msg=f"step {k}")
        np.testing.assert_allclose(params(model), params(eager), rtol=rtol, atol=rtol / 10,
                                   err_msg=f"step {k}")
    assert (solver.graphs.captures, solver.graphs.replays) == (1, 3)
    np.testing.assert_allclose(model.loss, eager.loss, rtol=rtol)


def test_the_training_commands_graphed_steps_give_its_eager_steps(device):
    """The training command's solver (its graphs, its non-finite check) against the same
    steps eager, on packed batches whose row length changes (one graph each, captured after
    warm-up)."""
    from examples.pos_tagging.tagger import TaggerConfig
    from examples.pos_tagging.train import TrainOptions, training_solver

    config, options = TaggerConfig(**SMALL_TAGGER), TrainOptions(data=None, model_dir=None)
    runs = []
    for graphs in (False, True):
        tagger, feeds = packed_tagger([5, 9], config, device=device)
        solver = training_solver(tagger.train_model, options, steps_per_epoch=3)
        assert (solver.graphs is not None) == (device in ("gpu", "trace"))
        if not graphs:
            solver.graphs = None
        runs.append((tagger.train_model, solver, feeds))
    rtol = 0 if device == "trace" else 1e-5
    (eager, eager_solver, eager_feeds), (model, solver, feeds) = runs
    for k, T in enumerate([5, 5, 9, 5, 9, 9, 5, 9, 5, 9]):
        want = eager_solver.step(1, feed=eager_feeds[T]())
        got = solver.step(1, feed=feeds[T]())
        np.testing.assert_allclose(got, want, rtol=rtol, err_msg=f"step {k}")
        np.testing.assert_allclose(params(model), params(eager), rtol=rtol, atol=rtol / 10,
                                   err_msg=f"step {k}")
    assert not solver.skipped and not eager_solver.skipped
    assert (solver.graphs.captures, solver.graphs.replays) == (2, 4)
    assert eager_solver.rate == solver.rate != options.learning_rate  # decayed: eager updates


def test_a_replayed_step_is_one_launch_and_reads_nothing_back():
    model, solver, feed, _ = small_tagger("trace")
    solver.graphs = StepGraphs(model, warmup=1)
    solver.step(2, feed=feed)
    inputs = feed(2)
    with trace.measure() as c:
        solver.graphs.gradients(inputs)
    # one launch for the graph, one copy per input into the graph's own buffers
    assert c.ops["graph.launch"] == 1 and c.launches == 1 + len(inputs)
    assert (c.syncs, c.transfers) == (0, 0)


def rnn_model(device="trace"):
    make = lambda T: unroll.expand("rnn", steps=T, batch=2, input_dim=3, hidden=4)  # noqa: E731
    model = BucketedModel(make, device=device, seed=3)
    return model, Solver(model, type="Adam", base_lr=0.05, momentum=0.9, momentum2=0.999,
                         lr_policy="inv", gamma=0.1,
                         power=0.75)


def rnn_batch(T, k):
    rng = np.random.default_rng(k)
    return {"x": rng.normal(size=(T, 2, 3)), "cont": (np.arange(T) > 0)[:, None].repeat(2, 1)}


def test_buckets_take_turns_and_each_is_captured_again_only_when_its_memory_moved():
    eager, eager_solver = rnn_model()
    model, solver = rnn_model()
    solver.graphs = StepGraphs(model, warmup=1)
    lengths = [3, 3, 3, 7, 7, 7, 3, 7, 3, 7, 3, 3]
    for k, T in enumerate(lengths):
        assert solver.step(1, feed=rnn_batch(T, k)) == eager_solver.step(1, feed=rnn_batch(T, k))
        np.testing.assert_array_equal(params(model), params(eager), err_msg=f"step {k}")
    # T=3 first, then T=7 grows the workspace: T=3's graph is captured again once, after
    # which both stay (the lr policy "inv" changes the rate every step: eager updates)
    assert solver.graphs.captures == 3
    assert eager_solver.rate == solver.rate and eager_solver.rate != 0.05


class Reading:
    """A model whose forward reads its loss back on the host (as a logging loop might)."""

    def __init__(self, net):
        self.net = net
        self.kept = []

    def __getattr__(self, name):
        return getattr(self.net, name)

    def forward(self, **inputs):
        out = self.net.forward(**inputs)
        float(self.net.device_loss)
        return out


class Keeping(Reading):
    """A model whose forward keeps a new device array every pass (a growing history)."""

    def forward(self, **inputs):
        out = self.net.forward(**inputs)
        self.kept.append(self.net.device_loss * 1)
        return out


TINY_INPUTS = {"x": np.ones((4, 3)), "t": np.zeros((4, 2))}


def test_a_pass_that_reads_the_device_is_refused_at_capture(device):
    model = Reading(Net(TINY, device=device))
    graphs = StepGraphs(model, warmup=1)
    graphs.gradients(TINY_INPUTS)  # eager: the read is allowed
    why = r": a host wait \(float\) during a capture" if device == "trace" else ""
    with pytest.raises(GraphError, match=r"cannot be captured as a CUDA graph" + why):
        graphs.gradients(TINY_INPUTS)


@pytest.mark.slow
def test_check_capturable_names_what_stops_a_capture():
    counts = check_capturable(small_lstm("trace")[0], small_lstm("trace")[2])
    assert (counts.syncs, counts.transfers) == (0, 0) and counts.launches > 0
    with pytest.raises(GraphError, match=r"makes 1 host wait\(s\) \(float\)"):
        check_capturable(Reading(Net(TINY, device="trace")), TINY_INPUTS)
    with pytest.raises(GraphError, match=r"makes \d+ bytes of new device memory kept"):
        check_capturable(Keeping(Net(TINY, device="trace")), TINY_INPUTS)


def test_the_default_taggers_step_is_capturable():
    model, _, feed, _ = small_tagger("trace")
    counts = check_capturable(model, {k: to_numpy(v) for k, v in feed(0).items()})
    assert counts.syncs == 0


def test_graphs_need_a_device_and_one_pass_per_iteration():
    with pytest.raises(GraphError, match=r"need a model on device 'gpu' \(or 'trace'.*'cpu'"):
        StepGraphs(Net(TINY))
    with pytest.raises(ValueError, match="warmup: expected at least 1"):
        StepGraphs(Net(TINY, device="trace"), warmup=0)
    with pytest.raises(GraphError, match="counts on device 'trace'"):
        check_capturable(Net(TINY), TINY_INPUTS)
    net = Net(TINY, device="trace")
    solver = Solver(net, type="SGD", base_lr=0.1, iter_size=2)
    solver.graphs = StepGraphs(net)
    with pytest.raises(SolverError, match="graphs replay one pass per iteration; iter_size is 2"):
        solver.step(1, feed=TINY_INPUTS)
