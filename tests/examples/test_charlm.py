"""examples/charlm: the stream and its windows, the loss against NumPy, carried state, bits per
character and sampling (docs/design.md, "Unrolling": truncated BPTT; "Stepping"); and its
commands: a resumed run equals the uninterrupted one, evaluate, sample, the symbols file
checked, --memory-budget (the per-application guarantees are in test_apps.py)."""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples.charlm.__main__ import main
from examples.charlm.model import BOUNDARY, IGNORE, CharLM, CharLMConfig, Symbols
from tests.cli_helpers import one_line_error
from tests.hang import limit
from unroll import carry_hidden
from unroll.core.errors import MemoryBudgetError
from unroll.core.proto import NetParameter, array_from_blob_proto
from unroll.tools.conllu import read_texts
from unroll.tools.ewt import TRAIN_FILE
from unroll.train import model_folder as folder
from unroll.train.trainer import TrainingDiverged

REPO = Path(__file__).resolve().parents[2]
#: mpiexec beside this Python (the mpich wheel's), else on PATH
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which(
    "mpiexec")
TEXTS = ["a cat sat.", "the dog ran!", "a dog sat on the cat.", "cats nap"]
SYMBOLS = Symbols.build(TEXTS)


def lm(steps=4, batch=3, hidden=5, seed=0) -> CharLM:
    return CharLM(SYMBOLS, CharLMConfig(embed=4, hidden=hidden, batch=batch, steps=steps),
                  seed=seed)


def params(model) -> dict:
    return {p.name: p.blob.data.astype(np.float64) for p in model.train_model.learnable_params}


def reference_nats(p: dict, x: np.ndarray, y: np.ndarray, h, c):
    """Summed cross-entropy of the valid targets of one (T, N) window, count, final (h, c):
    the template's equations in NumPy (Caffe's gate order i, f, o, g)."""
    def sigmoid(z):
        return 1 / (1 + np.exp(-z))

    H, nats, count = h.shape[-1], 0.0, 0
    for t in range(len(x)):
        z = p["E"][x[t]] @ p["W_xc"].T + p["b_c"] + h @ p["W_hc"].T
        i, f, o, g = sigmoid(z[:, :H]), sigmoid(z[:, H:2 * H]), sigmoid(z[:, 2 * H:3 * H]), \
            np.tanh(z[:, 3 * H:])
        c = f * c + i * g
        h = o * np.tanh(c)
        scores = h @ p["W_out"].T + p["b_out"]
        logp = scores - scores.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        for n in np.flatnonzero(y[t] != IGNORE):
            nats -= logp[n, y[t, n]]
            count += 1
    return nats, count, h, c


def test_symbols_put_unk_and_the_boundary_first_and_read_unknown_characters_as_unk():
    assert SYMBOLS.itos[:2] == ["<unk>", BOUNDARY]
    assert SYMBOLS.encode("a€").tolist() == [SYMBOLS.stoi["a"], 0]


def test_the_loss_of_each_window_equals_numpy_with_the_state_carried():
    model = lm(steps=4, batch=3)
    p, state = params(model), model.zero_state()
    h = c = np.zeros((3, 5))
    for window in model.windows(TEXTS):
        loss = float(model.train_model.forward(**model.inputs(window, state))["loss"])
        nats, count, h, c = reference_nats(p, *window, h, c)
        assert loss == pytest.approx(nats / count, rel=1e-5)
        state = carry_hidden(model.train_model)
        np.testing.assert_allclose(state["h_0"][0], h, atol=1e-6)
        np.testing.assert_allclose(state["c_0"][0], c, atol=1e-6)


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 12))
def test_carried_windows_score_the_stream_as_one_window_would(batch, steps, factor):
    """T steps a window with the state carried, or one window over the whole row: the same
    bits per character (truncated BPTT cuts only the gradient, never the forward)."""
    short, whole = lm(steps=steps, batch=batch), lm(steps=1000, batch=batch, seed=1)
    whole.train_model.copy_from(short.train_model.to_proto())
    assert short.bits_per_char(TEXTS[:factor % 4 + 1]) == pytest.approx(
        whole.bits_per_char(TEXTS[:factor % 4 + 1]), rel=1e-5)


def test_a_uniform_model_scores_log2_of_the_symbols():
    model = lm()
    for p in model.train_model.learnable_params:
        if p.name in ("W_out", "b_out"):
            p.blob.data[...] = 0
    assert model.bits_per_char(TEXTS) == pytest.approx(math.log2(len(SYMBOLS.itos)), rel=1e-6)


def test_sampling_is_a_function_of_the_seed_and_starts_with_the_prime():
    model = lm()
    drawn = [model.sample("a c", length=30, temperature=1.5, seed=s) for s in (3, 3, 4)]
    assert drawn[0] == drawn[1] and drawn[0].startswith("a c")
    assert BOUNDARY not in drawn[0] and len(drawn[0]) <= 33
    assert len({model.sample("", length=30, seed=s) for s in range(8)}) > 1


def test_a_cold_sample_follows_the_most_likely_symbol():
    """At a temperature near 0 sampling is greedy: each symbol is the argmax of the
    training net's prediction for the text so far."""
    model = lm(steps=1000, batch=1)
    text = model.sample("a", length=6, temperature=1e-3, seed=0)
    (x, _), = model.windows([text])
    probs = model.test_model.forward(blobs=["scores"], **model.inputs((x, x), model.zero_state()))
    greedy = probs["scores"][:, 0].argmax(-1)
    assert [SYMBOLS.itos[k] for k in greedy[1:len(text)]] == list(text[1:])


TINY = ["--steps", "5", "--batch", "3", "--hidden", "6", "--embed", "4"]


def train(corpus, model_dir, *extra) -> int:
    return main(["train", "--model-dir", str(model_dir), "--data", str(corpus), "--quiet",
                 *extra])


@pytest.mark.slow
def test_a_run_resumed_with_its_carried_state_equals_the_uninterrupted_run(corpus, tmp_path):
    """The state flows from epoch to epoch, so a resumed run needs the snapshot's carried
    state to go on as the uninterrupted one did, bit for bit."""
    assert train(corpus, tmp_path / "whole", "--epochs", "3", *TINY) == 0
    assert train(corpus, tmp_path / "resumed", "--epochs", "1", *TINY) == 0
    assert train(corpus, tmp_path / "resumed", "--epochs", "3", "--resume") == 0
    for name in ("last.caffemodel", "best.caffemodel", "log.json"):
        whole, resumed = (tmp_path / run / name for run in ("whole", "resumed"))
        if name == "log.json":  # the same records but for the time they took
            whole, resumed = ([{k: v for k, v in e.items() if k not in ("seconds", "tokens_per_s")}
                               for e in json.loads(p.read_text())] for p in (whole, resumed))
            assert whole == resumed
        else:
            assert whole.read_bytes() == resumed.read_bytes()


def test_the_learning_rate_is_recorded_and_another_is_refused_on_resume(corpus, tmp_path,
                                                                        capsys):
    assert train(corpus, tmp_path / "m", "--epochs", "1", "--lr", "0.01", *TINY) == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["lr"] == 0.01
    capsys.readouterr()
    assert train(corpus, tmp_path / "m", "--epochs", "2", "--resume", "--lr", "0.02") == 2
    one_line_error(capsys, "--resume", "trained with --lr 0.01", "given --lr 0.02")
    assert train(corpus, tmp_path / "m", "--epochs", "2", "--resume", "--lr", "0.01") == 0


@pytest.mark.slow
def test_evaluate_scores_the_best_weights_and_sample_writes_its_text(corpus, tmp_path, capsys):
    assert train(corpus, tmp_path / "m", "--epochs", "2", *TINY) == 0
    log = json.loads((tmp_path / "m" / "log.json").read_text())
    capsys.readouterr()
    assert main(["evaluate", "--model-dir", str(tmp_path / "m"), "--data", str(corpus)]) == 0
    assert capsys.readouterr().out == (
        f"dev bits per character: {min(e['dev_bpc'] for e in log):.4f}\n")
    out = tmp_path / "sample.txt"
    command = ["sample", "--model-dir", str(tmp_path / "m"), "--prime", "the ", "--seed", "2"]
    assert main([*command, "-o", str(out)]) == 0
    assert out.read_text().startswith("the ") and out.read_text().endswith("\n")
    with pytest.raises(SystemExit) as refused:  # checked when parsed
        main([*command, "--temperature", "0"])
    assert refused.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    symbols = tmp_path / "m" / "features.json"
    swapped = json.loads(symbols.read_text())
    swapped[2:4] = swapped[3:1:-1]  # two characters trade ids: every prediction would change
    symbols.write_text(json.dumps(swapped))
    assert main(command) == 2
    refusal = capsys.readouterr().err
    assert refusal.count("\n") == 1 and "features.json" in refusal


def test_sampling_a_model_whose_probabilities_are_not_finite_is_refused():
    model = lm()
    for p in model.train_model.learnable_params:
        if p.name == "b_out":
            p.blob.data[...] = np.nan
    with pytest.raises(TrainingDiverged, match="probabilities are not finite"):
        model.sample("a", length=5)


def test_sample_on_a_diverged_model_ends_in_one_line_and_status_1(corpus, tmp_path, capsys):
    """A folder whose best weights are NaN (log.json vouching for them, as it would for a
    training whose weights overflowed)."""
    model_dir = tmp_path / "m"
    assert train(corpus, model_dir, "--epochs", "1", *TINY) == 0
    weights = NetParameter.FromString((model_dir / "best.caffemodel").read_bytes())
    for layer in weights.layer:
        for blob in layer.blobs:
            blob.data[:] = [math.nan] * len(blob.data)
    (model_dir / "best.caffemodel").write_bytes(weights.SerializeToString())
    log = json.loads((model_dir / "log.json").read_text())
    log[-1]["sha256"]["best.caffemodel"] = folder.sha256(weights.SerializeToString())
    (model_dir / "log.json").write_text(json.dumps(log))
    capsys.readouterr()
    assert main(["sample", "--model-dir", str(model_dir), "--prime", "the "]) == 1
    one_line_error(capsys, "sample: ", "probabilities are not finite", "lower --lr")


@pytest.mark.slow
def test_a_memory_budget_trains_bit_identically(corpus, tmp_path, capsys):
    steps = ["--steps", "40", "--batch", "3", "--hidden", "6", "--embed", "4"]
    assert train(corpus, tmp_path / "small", "--memory-budget", "1000", *steps) == 2
    assert "memory_budget 1,000 bytes is too small" in capsys.readouterr().err
    symbols = Symbols.build(read_texts(corpus / TRAIN_FILE))

    def plan(budget):
        return CharLM(symbols, CharLMConfig(4, 6, 3, 40), memory_budget=budget).train_model.net(40)

    with pytest.raises(MemoryBudgetError) as refused:
        plan(10_000)  # enough for the one-step net the model builds first, not for T = 40
    budget = refused.value.smallest  # what the plan needs that recomputes the most
    assert plan(budget).memory_report().planned < plan(None).memory_report().planned
    for name, extra in (("full", []), ("tight", ["--memory-budget", str(budget)])):
        assert train(corpus, tmp_path / name, "--epochs", "1", *steps, *extra) == 0
    assert ((tmp_path / "full" / "last.caffemodel").read_bytes()
            == (tmp_path / "tight" / "last.caffemodel").read_bytes())


def mpiexec_train(corpus, model_dir, *extra) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MPLBACKEND="Agg")
    return subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "examples.charlm", "train",
                           "--model-dir", str(model_dir), "--data", str(corpus), "--quiet",
                           *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=limit(300))


@pytest.mark.slow
@pytest.mark.skipif(MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
                    reason="needs mpi4py and mpiexec: pip install -e '.[mpi]'")
def test_two_ranks_read_their_own_rows_and_resume_with_their_own_state(corpus, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    for run in (mpiexec_train(corpus, whole, "--epochs", "2", *TINY),
                mpiexec_train(corpus, resumed, "--epochs", "1", *TINY),
                mpiexec_train(corpus, resumed, "--epochs", "2", "--resume")):
        assert run.returncode == 0, run.stderr
    assert ((whole / "last.caffemodel").read_bytes()
            == (resumed / "last.caffemodel").read_bytes())
    entry = json.loads((whole / "log.json").read_text())[-1]
    carried = NetParameter.FromString((whole / entry["carried"]).read_bytes())
    h = {layer.name: array_from_blob_proto(layer.blobs[0]) for layer in carried.layer}["h_0"]
    assert h.shape == (2, 1, 3, 6) and not np.array_equal(h[0], h[1])  # a state a rank
