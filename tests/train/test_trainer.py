"""The Trainer on a tiny application: seeding, resume bit for bit, non-finite policy, time.

docs/design.md, 10. Training. The application is a linear regression with
dropout, a draw of its own per batch (as word dropout is) and a state it
carries from batch to batch and epoch to epoch (as truncated BPTT does), so
every stream the Trainer seeds and every piece of state it snapshots shows
in the weights or the carried state at the end.
"""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unroll.core import json_files
from unroll.engine.net import Net
from unroll.train import model_folder as folder
from unroll.train.trainer import (
    Batches,
    Metric,
    ParamAverage,
    Trainer,
    TrainingDiverged,
    epoch_streams,
    log_schema,
)

NET = """
layer { name: "in" type: "Input" top: "x" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "drop" type: "Dropout" bottom: "p" top: "p" dropout_param { dropout_ratio: 0.2 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""
#: batches of 4 rows an epoch
BATCHES = 5


class Interrupt(KeyboardInterrupt):
    """Ctrl-C, raised by the application where a test says."""


class Regression:
    """A tiny application: y = x W on 20 rows, dev error on 4 more.

    ``interrupt_at`` (epoch, batch) raises Ctrl-C there (batch None: in the evaluation);
    ``bad_at`` is a set of (epoch, batch) whose inputs are NaN. ``draws`` records, per
    epoch, what the seeded streams gave; ``carried`` is a running sum of the batches' own
    draws and inputs, carried into every next batch.
    """

    files = folder.ModelFiles(
        log_schema({"dev_error": json_files.finite()}, ["dev_error"], carried=True),
        {folder.CONFIG: {"type": "object", "description": "an object"}})
    metric = Metric("dev_error", "dev error", mode="min")
    curve_title = "regression"

    def __init__(self, interrupt_at=None, bad_at=(), config=None):
        self.interrupt_at, self.bad_at = interrupt_at, set(bad_at)
        self.config = config or {}
        self.draws: dict[int, list] = {}
        self.epoch = -1
        self.k = 0

    def read_data(self):
        rng = np.random.default_rng(7)
        self.x = rng.normal(size=(24, 3)).astype(np.float32)
        self.y = (self.x @ np.array([[1, -1], [0.5, 2], [-1, 0]], np.float32)).astype(np.float32)

    def create(self, model_dir):
        folder.write_json(model_dir / folder.CONFIG, self.config)

    def load(self, model_dir, log):
        folder.settings_differ(model_dir, {"config": self.config},
                               {"config": folder.read_json(model_dir, self.files,
                                                           folder.CONFIG, log)})

    def model(self, model_dir, seed):
        self.net = Net(NET, seed=seed)
        self.carry = np.zeros(3, np.float32)
        return self.net

    def sampler(self, seed, rank, size):
        return Batches(20, seed, rank, size, batch_size=4)

    def solver_fields(self, steps_per_epoch):
        return {"type": "Adam", "base_lr": 0.05, "momentum": 0.9, "momentum2": 0.999,
                "lr_policy": "step", "gamma": 0.5, "stepsize": steps_per_epoch}

    def seed_epoch(self, rng):
        self.epoch += 1
        self.k = 0
        self.rng = rng

    def batch(self, rows):
        draw = self.rng.random()
        self.draws.setdefault(self.epoch, []).append((list(rows), draw))
        if self.interrupt_at == (self.epoch, self.k):
            raise Interrupt
        x = self.x[rows] + self.carry * 0.01
        self.carry = (self.carry + x.sum(axis=0) + draw).astype(np.float32)
        if (self.epoch, self.k) in self.bad_at:
            x = np.full_like(x, np.nan)
        self.k += 1
        return {"x": x, "y": self.y[rows]}, len(rows)

    def evaluate(self, epoch):
        if self.interrupt_at == (epoch, None):
            raise Interrupt
        self.net.forward(x=self.x[20:], y=self.y[20:])
        return {"dev_error": float(self.net.loss)}

    def carried_state(self):
        return {"carry": self.carry}

    def restore_carried_state(self, state):
        self.carry = state["carry"].copy()


def fit(app, model_dir, **options):
    return Trainer(app, model_dir, **{"epochs": 3, "quiet": True, "curve": False} | options).fit()


def final_state(model_dir):
    """Every byte the folder keeps of the last epoch: weights, solver, average, carried."""
    log = folder.read_log(model_dir, Regression.files)
    files = sorted(folder.snapshot_files(log[-1]) | {"last.caffemodel", "best.caffemodel"})
    return {name: (model_dir / name).read_bytes() for name in files}


def records(model_dir):
    """log.json without the times."""
    return [{k: v for k, v in e.items() if k not in ("seconds", "tokens_per_s")}
            for e in json.loads((model_dir / folder.LOG).read_text())]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("uninterrupted")
    app = Regression()
    fit(app, model_dir)
    return model_dir, app


def test_every_epochs_draws_are_those_of_its_seed_rank_and_epoch(uninterrupted, tmp_path):
    _, whole = uninterrupted
    assert len(whole.draws) == 3 and all(len(d) == BATCHES for d in whole.draws.values())
    assert whole.draws[1] != whole.draws[2]  # a new shuffle and new draws every epoch
    fit(Regression(), tmp_path, epochs=1)
    resumed = Regression()
    fit(resumed, tmp_path, resume=True)  # epochs 2 and 3 in another process's stead
    assert resumed.draws == {0: whole.draws[1], 1: whole.draws[2]}
    other = Regression()
    fit(other, tmp_path / "seed 1", seed=1, epochs=1)
    assert other.draws[0] != whole.draws[0]


def test_the_streams_of_an_epoch_are_a_function_of_seed_rank_and_epoch():
    streams = {key: epoch_streams(*key) for key in [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0)]}
    draws = {key: (dropout, rng.random()) for key, (dropout, rng) in streams.items()}
    assert len(set(draws.values())) == 4
    assert draws[(0, 1, 0)] == (epoch_streams(0, 1, 0)[0], epoch_streams(0, 1, 0)[1].random())


@settings(max_examples=6, deadline=None)
@given(epoch=st.integers(0, 2), batch=st.one_of(st.none(), st.integers(0, BATCHES - 1)))
def test_a_run_interrupted_anywhere_then_resumed_equals_the_uninterrupted_run(
        uninterrupted, tmp_path_factory, epoch, batch):
    whole_dir, _ = uninterrupted
    model_dir = tmp_path_factory.mktemp("interrupted")
    with pytest.raises(Interrupt):
        fit(Regression(interrupt_at=(epoch, batch)), model_dir)
    # the first epoch may not have ended: --resume then starts over, saying so
    fit(Regression(), model_dir, resume=True)
    assert final_state(model_dir) == final_state(whole_dir)
    assert records(model_dir) == records(whole_dir)


def test_the_carried_state_is_part_of_the_snapshot(uninterrupted, tmp_path):
    fit(Regression(), tmp_path, epochs=2)
    entry = folder.read_log(tmp_path, Regression.files)[-1]
    carried = tmp_path / entry["carried"]
    carried.write_bytes(carried.read_bytes()[:-1] + b"\x00")  # a changed state is refused
    with pytest.raises(folder.ModelFolderError, match="checksum"):
        fit(Regression(), tmp_path, resume=True)


def test_a_bad_batch_stops_training_before_anything_of_it_is_saved(tmp_path):
    fit(Regression(), tmp_path, epochs=1)
    kept = final_state(tmp_path)
    with pytest.raises(TrainingDiverged, match=r"^training diverged at epoch 2, batch 3 "
                                               r"\(iteration 7\): loss nan.*keeps epoch 1"):
        fit(Regression(bad_at={(0, 2)}), tmp_path, resume=True)
    assert final_state(tmp_path) == kept


def test_bad_batches_are_skipped_up_to_the_number_allowed(tmp_path, capsys):
    log = fit(Regression(bad_at={(0, 1), (1, 3)}), tmp_path / "two", skip_bad_batches=2)
    assert log["epoch"] == 3
    out = capsys.readouterr().out
    assert "skipped a bad batch at epoch 1, batch 2" in out and "(2 of at most 2)" in out
    with pytest.raises(TrainingDiverged, match="epoch 2, batch 4"):
        fit(Regression(bad_at={(0, 1), (1, 3)}), tmp_path / "one", skip_bad_batches=1)


class Clock:
    """Time that passes only as the application's batches say: ``step`` seconds each."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now


class TimedRegression(Regression):
    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def batch(self, rows):
        self.clock.now += self.clock.step
        return super().batch(rows)


def test_max_minutes_stops_before_the_next_epoch_counting_earlier_runs(tmp_path):
    clock = Clock(step=10)  # 50 s an epoch
    log = fit(TimedRegression(clock), tmp_path, epochs=5, max_minutes=1.5, clock=clock)
    assert log["epoch"] == 2 and log["stopped"] == "stopped by --max-minutes after 2 of 5 epochs"
    # a resumed run counts the 100 s logged: one more epoch starts under 2.4 minutes
    clock = Clock(step=10)
    log = fit(TimedRegression(clock), tmp_path, epochs=5, max_minutes=2.4, clock=clock,
              resume=True)
    assert log["epoch"] == 3 and log["stopped"].endswith("after 3 of 5 epochs")
    assert [e.get("stopped") for e in json.loads((tmp_path / folder.LOG).read_text())] == [
        None, "stopped by --max-minutes after 2 of 5 epochs",
        "stopped by --max-minutes after 3 of 5 epochs"]


def test_a_limit_reached_before_the_first_epoch_leaves_no_log(tmp_path):
    clock = Clock(step=0)
    clock.now = 0.0
    app = Regression()
    read = app.read_data
    app.read_data = lambda: (read(), setattr(clock, "now", 120.0))  # a slow read
    assert fit(app, tmp_path, max_minutes=1, clock=clock) == {
        "stopped": "stopped by --max-minutes after 0 of 3 epochs"}
    assert not (tmp_path / folder.LOG).exists()


def test_a_folder_killed_before_its_first_epoch_can_be_trained(tmp_path):
    with pytest.raises(Interrupt):
        fit(Regression(interrupt_at=(0, 1)), tmp_path)
    assert (tmp_path / folder.CONFIG).exists() and not (tmp_path / folder.LOG).exists()
    assert fit(Regression(config={"other": 1}), tmp_path)["epoch"] == 3


@pytest.mark.parametrize("option, value, message", [
    ("epochs", 0, "--epochs: expected an integer >= 1, found 0"),
    ("max_minutes", -1, "--max-minutes: expected a number >= 0, found -1"),
    ("seed", -1, r"--seed: expected an integer in \[0, 2\*\*63\), found -1"),
    ("skip_bad_batches", -1, "--skip-bad-batches: expected an integer >= 0, found -1"),
])
def test_bad_options_are_refused_before_anything_runs(tmp_path, option, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        Trainer(Regression(), tmp_path, **{"epochs": 1, option: value})
    assert not any(tmp_path.iterdir())


def test_a_different_seed_is_refused_on_resume(tmp_path):
    fit(Regression(), tmp_path, epochs=1)
    with pytest.raises(folder.ModelFolderError, match=r"seed 4 \(the folder has 0\)"):
        fit(Regression(), tmp_path, resume=True, seed=4)


def test_every_run_records_the_learning_rate(tmp_path):
    fit(Regression(), tmp_path, epochs=2)
    assert [e["options"] for e in records(tmp_path)] == [{"--lr": 0.05}] * 2


class RatedRegression(Regression):
    """The regression with ``--gamma`` (gamma, ``gamma`` where given, else 0.5) part of the
    run's record besides ``--lr`` (base_lr, ``lr`` where given, else 0.05), which every run
    records."""

    recorded_options = {"--gamma": "gamma"}

    def __init__(self, lr=None, gamma=None):
        super().__init__()
        self.lr, self.gamma = lr, gamma

    def solver_fields(self, steps_per_epoch):
        return super().solver_fields(steps_per_epoch) | {"base_lr": self.lr or 0.05,
                                                         "gamma": self.gamma or 0.5}


def test_recorded_options_are_logged_and_a_resume_takes_or_checks_them(tmp_path):
    def run(lr, gamma=None, **options):
        return fit(RatedRegression(lr, gamma), tmp_path, given={"--lr": lr, "--gamma": gamma},
                   **options)

    run(0.01, epochs=1)
    assert [e["options"] for e in records(tmp_path)] == [{"--lr": 0.01, "--gamma": 0.5}]
    with pytest.raises(folder.ModelFolderError,
                       match=r"trained with --lr 0\.01, given --lr 0\.02: drop the option"):
        run(0.02, epochs=2, resume=True)
    with pytest.raises(folder.ModelFolderError,
                       match=r"trained with --gamma 0\.5, given --gamma 0\.25: drop the option"):
        run(None, 0.25, epochs=2, resume=True)
    assert len(records(tmp_path)) == 1
    run(None, epochs=2, resume=True)  # not given: the folder's, not the application's 0.05
    assert [e["options"]["--lr"] for e in records(tmp_path)] == [0.01, 0.01]
    whole = tmp_path / "whole"
    fit(RatedRegression(0.01), whole, epochs=2, given={"--lr": 0.01})
    assert final_state(whole) == final_state(tmp_path)


def test_a_folder_whose_record_lacks_an_option_resumes_with_the_applications(tmp_path):
    fit(Regression(), tmp_path, epochs=1)  # its record: --lr alone
    fit(RatedRegression(gamma=0.25), tmp_path, epochs=2, resume=True,
        given={"--gamma": 0.25})
    assert [e["options"] for e in records(tmp_path)] == [{"--lr": 0.05},
                                                        {"--lr": 0.05, "--gamma": 0.25}]


@given(n=st.integers(1, 40), batch_size=st.integers(1, 5), size=st.integers(1, 4),
       epoch=st.integers(0, 5))
def test_unshuffled_batches_deal_the_items_in_order_to_every_rank_alike_each_epoch(
        n, batch_size, size, epoch):
    shares = [Batches(n, 3, rank, size, batch_size, shuffle=False).epoch_batches(epoch)
              for rank in range(size)]
    steps = n // batch_size // size
    assert all(len(share) == steps for share in shares)
    dealt = [rows for k in range(steps) for rows in (share[k] for share in shares)]
    assert dealt == [list(range(k * batch_size, (k + 1) * batch_size))
                     for k in range(steps * size)]


def test_the_average_moves_each_param_by_its_rate_bit_for_bit():
    """Polyak averaging (docs/design.md, Training): ``avg += rate * (param - avg)``, each
    param in its own shape and size, with rate 1 - min(decay, (1 + n) / (10 + n))."""
    net = Net(NET.replace("num_output: 2", "num_output: 2 bias_filler { type: \"gaussian\" }"))
    average = ParamAverage(net.learnable_params)
    expected = [p.blob.data.copy() for p in average.params]
    rng = np.random.default_rng(0)
    for n in range(1, 4):
        for p in average.params:
            p.blob.data[...] = rng.normal(size=p.blob.shape)
        average.update()
        rate = 1 - min(average.decay, (1 + n) / (10 + n))
        expected = [e + rate * (p.blob.data - e) for e, p in zip(expected, average.params)]
        assert all(np.array_equal(v, e) for v, e in zip(average.values, expected))
    assert [v.shape for v in average.values] == [(2, 3), (2,)]


@settings(max_examples=30, deadline=None)
@given(dtype=st.sampled_from([np.float32, np.float64]), shapes=st.lists(
    st.tuples(st.integers(1, 70), st.integers(1, 40)), min_size=1, max_size=3),
    decay=st.floats(0.5, 0.9999), seed=st.integers(0, 2**32 - 1))
def test_the_compiled_average_has_the_bits_of_the_array_form(monkeypatch, dtype, shapes, decay,
                                                             seed):
    """The host's one-pass average (the fused engine) and the three array passes (the
    reference engine, a GPU's form) give the same values bit for bit, update after update."""
    from unroll.engine.kernels import ENGINE_VARIABLE

    class Param:  # what ParamAverage reads of a learnable param
        def __init__(self, data):
            self.lr_mult, self.blob = 1.0, type("Blob", (), {"data": data})()

    rng = np.random.default_rng(seed)
    start = [rng.normal(size=shape).astype(dtype) for shape in shapes]
    averages = {}
    for engine in ("fused", "reference"):
        monkeypatch.setenv(ENGINE_VARIABLE, engine)
        params = [Param(value.copy()) for value in start]
        averages[engine] = ParamAverage(params, decay=decay)
        assert averages[engine].compiled == (engine == "fused")
    draws = np.random.default_rng(seed + 1)
    for _ in range(4):
        values = [draws.normal(size=shape).astype(dtype) for shape in shapes]
        for average in averages.values():
            for p, value in zip(average.params, values):
                p.blob.data[...] = value
            average.update()
    for fused, reference in zip(averages["fused"].values, averages["reference"].values):
        assert fused.dtype == reference.dtype == dtype
        assert np.array_equal(fused, reference)
