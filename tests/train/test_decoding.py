"""Greedy decoding, sampling and beam search over a Stepper (docs/design.md, "Stepping")."""

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import unroll
from unroll.testing import static_inputs
from unroll.train.decoding import (
    StepperDecoder,
    TableDecoder,
    beam_search,
    best_extensions,
    greedy,
    sample,
)
from unroll.train.stepper import Stepper

BOS, EOS, VOCAB, HIDDEN, MEMORY = 1, 0, 5, 3, 4

#: a decoder with dot attention over a static memory (S, N, H), read after its LSTM
ATTENDING = """\
{% set interface = {"kind": "net", "defaults": {}} %}
name: "attending_T{{ T }}"
layer { name: "input" type: "Input" top: "tokens" top: "cont" top: "memory"
  input_param { shape { dim: {{ T }} dim: {{ batch }} } shape { dim: {{ T }} dim: {{ batch }} }
                shape { dim: @S@ dim: {{ batch }} dim: @H@ } } }
layer { name: "embed" type: "Embed" bottom: "tokens" top: "x" param { name: "E" }
  embed_param { input_dim: @V@ num_output: @H@ bias_term: false
                weight_filler { type: "uniform" min: -1 max: 1 } } }
{{ recurrent("lstm", "x", "h", cont="cont", expose_hidden=True, hidden=@H@) }}
layer { name: "query" type: "Reshape" bottom: "h" top: "query"
  reshape_param { shape { dim: -1 dim: @H@ } } }
layer { name: "scores" type: "BatchMatMul" bottom: "memory" bottom: "query" top: "scores" }
layer { name: "weights" type: "Softmax" bottom: "scores" top: "weights"
  softmax_param { axis: 0 } }
layer { name: "context" type: "BatchMatMul" bottom: "weights" bottom: "memory" top: "context" }
layer { name: "both" type: "Concat" bottom: "query" bottom: "context" top: "both" }
layer { name: "logits" type: "InnerProduct" bottom: "both" top: "logits"
  inner_product_param { num_output: @V@ weight_filler { type: "uniform" min: -3 max: 3 } } }
layer { name: "probs" type: "Softmax" bottom: "logits" top: "probs" }
""".replace("@S@", str(MEMORY)).replace("@H@", str(HIDDEN)).replace("@V@", str(VOCAB))


@pytest.fixture(scope="module")
def attending(tmp_path_factory):
    """(a StepperDecoder factory over the attending net, the states and memory of 4 sequences)."""
    path = tmp_path_factory.mktemp("templates") / "attending.prototxt.j2"
    path.write_text(ATTENDING)
    stepper = Stepper(unroll.expand(str(path), steps=1, batch=2), dtype="float64")
    rng = np.random.default_rng(3)
    n = 4
    states = {name: rng.normal(size=(1, n, HIDDEN)) for name in ("h_0", "c_0")}
    memory = rng.normal(size=(MEMORY, n, HIDDEN))

    def decoder(rows):
        made = StepperDecoder(stepper, static={"memory": memory[:, rows]})
        made.start({name: value[:, rows] for name, value in states.items()})
        return made

    return decoder, n


def tables():
    """Random next-token log probabilities over VOCAB tokens, one row per previous token."""
    return st.integers(0, 2**32 - 1).map(lambda seed: np.log(np.random.default_rng(seed)
                                                             .dirichlet(np.ones(VOCAB), VOCAB)))


@settings(max_examples=30, deadline=None)
@given(table=tables(), max_len=st.integers(1, 6))
def test_greedy_is_a_beam_of_width_one(table, max_len):
    want = greedy(TableDecoder(table), 3, BOS, EOS, max_len)
    got = beam_search(TableDecoder(table), 3, BOS, EOS, max_len, beam=1)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-12)


def best_by_enumeration(table, max_len):
    """The best (tokens, score) of every sequence that ends (eos) within max_len steps: with
    every end probable, the search returns an ended one."""
    found = ([], -np.inf)
    for n in range(max_len):
        for tokens in itertools.product(range(1, VOCAB), repeat=n):
            path = [BOS, *tokens, EOS]
            score = sum(table[a, b] for a, b in zip(path, path[1:]))
            if score > found[1]:
                found = (list(tokens), score)
    return found


@settings(max_examples=15, deadline=None)
@given(table=tables(), max_len=st.integers(1, 3))
def test_a_beam_wide_enough_finds_the_best_sequence_and_never_loses_to_greedy(table, max_len):
    wide = VOCAB ** max_len
    (tokens, score), = beam_search(TableDecoder(table), 1, BOS, EOS, max_len, beam=wide)
    want_tokens, want_score = best_by_enumeration(table, max_len)
    assert score == pytest.approx(want_score, rel=1e-12) and tokens == want_tokens
    (greedy_tokens, greedy_score), = greedy(TableDecoder(table), 1, BOS, EOS, max_len)
    if len(greedy_tokens) < max_len:  # greedy's ended too (a cut one is of another kind)
        assert score >= greedy_score - 1e-12


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_decoding_a_batch_equals_decoding_each_sequence_alone(attending, search):
    """Every live hypothesis of every sequence in one step call: the same tokens and scores
    as one sequence at a time, the attention memory following each hypothesis."""
    decoder, n = attending

    def run(rows):
        made = decoder(rows)
        if search == "greedy":
            return greedy(made, len(rows), BOS, EOS, max_len=8)
        return beam_search(made, len(rows), BOS, EOS, max_len=8, beam=3)

    together = run(np.arange(n))
    alone = [run(np.array([i]))[0] for i in range(n)]
    assert [tokens for tokens, _ in together] == [tokens for tokens, _ in alone]
    # the same tokens; the scores to rounding (BLAS sums a batch of rows in its own order)
    np.testing.assert_allclose([s for _, s in together], [s for _, s in alone], rtol=1e-13)
    assert len({tuple(tokens) for tokens, _ in together}) > 1  # the memories differ


def test_greedy_is_a_beam_of_width_one_over_the_stepper(attending):
    decoder, n = attending
    rows = np.arange(n)
    narrow = greedy(decoder(rows), n, BOS, EOS, max_len=8)
    wide = beam_search(decoder(rows), n, BOS, EOS, max_len=8, beam=1)
    assert [t for t, _ in wide] == [t for t, _ in narrow]


def test_sampling_repeats_with_its_seed_and_sharpens_into_greedy(attending):
    decoder, n = attending
    rows = np.arange(n)
    first = sample(decoder(rows), n, BOS, EOS, max_len=8, seed=5)
    assert sample(decoder(rows), n, BOS, EOS, max_len=8, seed=5) == first
    assert sample(decoder(rows), n, BOS, EOS, 8, seed=5, temperature=1e-6) == \
        greedy(decoder(rows), n, BOS, EOS, 8)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sample(decoder(rows), n, BOS, EOS, 8, temperature=0)


def test_the_decoder_names_inputs_it_lacks_and_inputs_the_net_lacks(attending):
    decoder, _ = attending
    stepper = decoder(np.arange(2)).stepper
    with pytest.raises(ValueError, match=r"also needs \['memory'\].*static=\{'memory': \.\.\.\}"):
        StepperDecoder(stepper)
    with pytest.raises(ValueError, match=r"\['target'\] are not inputs of the step net"):
        StepperDecoder(stepper, token="target", static={"memory": np.zeros((MEMORY, 2, 3))})


def _attention_decoder(batch, source_steps, **options):
    """A StepperDecoder over the built-in attention cell (its "h" read as log probabilities
    of the next "x"), with a memory (S, N, H) and its mask (S, N) of ``batch`` sequences."""
    stepper = Stepper(unroll.expand("lstm_attention", steps=1, batch=2, input_dim=1,
                                    hidden=HIDDEN, source_steps=source_steps,
                                    expose_hidden=True), dtype="float64")
    static = static_inputs("lstm_attention", batch, hidden=HIDDEN, source_steps=source_steps)
    return StepperDecoder(stepper, token="x", output="h", log=True, static=static, **options)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_static_mask_follows_its_sequence_along_the_batch_axis_the_net_declares(search):
    """The memory (S, N, H) and its mask (S, N) both keep the batch at axis 1."""
    n = 3
    rng = np.random.default_rng(7)
    states = {name: rng.normal(size=(1, n, HIDDEN)) for name in ("h_0", "c_0")}

    def run(rows):
        made = _attention_decoder(n, source_steps=5)
        made.static = {name: value[:, rows] for name, value in made.static.items()}
        made.start({name: value[:, rows] for name, value in states.items()})
        args = (made, len(rows), 0, 2, 4)
        return greedy(*args) if search == "greedy" else beam_search(*args, beam=2)

    assert _attention_decoder(n, 5).batch_axes == {"memory": 1, "memory_mask": 1}
    together = run(np.arange(n))
    alone = [run(np.array([i]))[0] for i in range(n)]
    assert [tokens for tokens, _ in together] == [tokens for tokens, _ in alone]
    # the same tokens; the scores to rounding (BLAS sums a batch of rows in its own order)
    np.testing.assert_allclose([s for _, s in together], [s for _, s in alone], rtol=1e-13)


def test_a_batch_axis_the_shapes_cannot_tell_is_asked_for():
    """Memory steps as many as the batch, in the net and in the values: say the axis."""
    decoder = _attention_decoder(2, source_steps=2)
    with pytest.raises(ValueError, match=r"batch axis of static input 'memory' \(2, 2, 3\).*"
                                         r"batch_axes=\{'memory': \.\.\.\}"):
        decoder.start({name: np.zeros((1, 2, HIDDEN)) for name in ("h_0", "c_0")})
    told = _attention_decoder(2, source_steps=2, batch_axes={"memory": 1, "memory_mask": 1})
    told.start({name: np.zeros((1, 2, HIDDEN)) for name in ("h_0", "c_0")})
    assert told.batch_axes == {"memory": 1, "memory_mask": 1}


class Counting:
    """A decoder that records the rows of every step call it passes on."""

    def __init__(self, decoder):
        self.decoder, self.rows = decoder, []

    def step(self, tokens):
        self.rows.append(len(tokens))
        return self.decoder.step(tokens)

    def reorder(self, rows):
        self.decoder.reorder(rows)


@pytest.mark.parametrize("beam", [1, 3])
def test_each_search_step_is_one_call_for_every_live_hypothesis(attending, beam):
    """One step call per step for the whole batch, the beams folded into its rows."""
    decoder, n = attending
    counted = Counting(decoder(np.arange(n)))
    search = greedy if beam == 1 else functools.partial(beam_search, beam=beam)
    search(counted, n, BOS, EOS, max_len=8)
    assert 1 <= len(counted.rows) <= 8
    assert counted.rows[0] == n * beam
    assert all(a >= b for a, b in zip(counted.rows, counted.rows[1:]))  # the ended leave


class EndingInTurn:
    """Sequence i emits token 2 until its step i, then eos; it records the rows stepped."""

    def __init__(self, batch):
        self.of_row, self.t, self.rows = np.arange(batch), 0, []

    def step(self, tokens):
        self.rows.append(len(tokens))
        logp = np.full((len(tokens), VOCAB), -5.0)
        logp[:, 2] = -1.0
        logp[self.of_row == self.t, EOS] = -0.5
        self.t += 1
        return logp

    def reorder(self, rows):
        self.of_row = self.of_row[np.asarray(rows)]


def test_ended_hypotheses_leave_the_batch_by_halves():
    """Each new batch size costs the step net a reshape: ended rows step on, unread,
    until half of the batch has ended (docs/design.md, "Stepping")."""
    decoder = EndingInTurn(8)
    found = greedy(decoder, 8, BOS, EOS, max_len=10)
    assert [tokens for tokens, _ in found] == [[2] * i for i in range(8)]
    assert [score for _, score in found] == [-0.5 - i for i in range(8)]
    assert decoder.rows == [8, 8, 8, 8, 4, 4, 2, 1]



@pytest.mark.parametrize("beam", [1, 3])
def test_the_static_inputs_go_into_the_net_once_per_reorder_not_per_step(attending, beam,
                                                                         monkeypatch):
    """The memory is set into the step net (Stepper.set_static) at the first step and at
    the first after a reorder that moves a row to another sequence's memory: decoding that
    nothing ends (eos is never drawn) sets it once, greedy or beam search, whose reorder at
    every step keeps each row within its sequence."""
    decoder, n = attending
    made = decoder(np.arange(n))
    sets = []
    net = made.stepper.net
    set_input = net.set_input
    monkeypatch.setattr(net, "set_input", lambda name, value: (
        sets.append(name) if name == "memory" else None, set_input(name, value))[1])
    counted = Counting(made)
    search = greedy if beam == 1 else functools.partial(beam_search, beam=beam)
    search(counted, n, BOS, VOCAB, max_len=6)
    assert len(counted.rows) == 6
    assert len(sets) == 1


@pytest.mark.parametrize("beam", [1, 3])
def test_decoding_is_the_same_bits_at_one_and_two_threads(attending, beam):
    decoder, n = attending
    search = greedy if beam == 1 else functools.partial(beam_search, beam=beam)
    found = []
    try:
        for threads in (1, 2):
            unroll.engine.threads.set_num_threads(threads)
            found.append(search(decoder(np.arange(n)), n, BOS, EOS, max_len=8))
    finally:
        unroll.engine.threads.set_num_threads(None)
    assert found[0] == found[1]


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.sampled_from([-np.inf, -3.0, -1.5, -1.0, 0.0, np.nan]),
                              min_size=6, max_size=6), min_size=1, max_size=5),
       count=st.integers(1, 7))
def test_the_best_extensions_are_a_stable_sort_of_the_scores_cut_to_their_count(rows, count):
    """Ties (a beam's dead rows are all -inf) fall by column, as the stable sort has them."""
    total = np.array(rows)
    want = np.argsort(-total, axis=1, kind="stable")[:, :count]
    np.testing.assert_array_equal(best_extensions(total, count), want)
