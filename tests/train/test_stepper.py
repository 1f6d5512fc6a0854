"""Stepper: a net run one step at a time equals the net unrolled over the same inputs.

docs/design.md, "Stepping": nets over one ParamStore share every named param, so a net
unrolled to one step runs the weights of any T; expose_hidden makes each state an input
X_0 and an output X_T, which the stepper carries from call to call.
"""

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import unroll
from unroll.core.errors import NetError
from unroll.frontend.template import load_template
from unroll.testing import builtin_templates, static_inputs
from unroll.train.stepper import Stepper

CELLS = builtin_templates("step")
T, N, D, H = 6, 3, 4, 5


def _make(cell, layers):
    return lambda steps: unroll.expand(cell, steps=steps, batch=N, input_dim=D, hidden=H,
                                       layers=layers, expose_hidden=True)


def conts(batch=N):
    """Cont patterns of T steps, a zero (a sequence starts) anywhere, the first step too."""
    return st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=batch, max_size=batch),
                    min_size=T, max_size=T).map(np.array)


@functools.cache
def _given_pair(cell):
    """(the net unrolled to T steps from initial_state= blobs, a Stepper over its weights,
    {given blob: X_0 of the Stepper})."""
    states = load_template(cell).interface["states"]
    given = {state: f"{state}_given" for state in states}
    whole = unroll.Net(unroll.expand(cell, steps=T, batch=N, input_dim=D, hidden=H,
                                     initial_state=given), phase="test", dtype="float64")
    stepper = Stepper(_make(cell, 1)(1), store=whole.store, dtype="float64")
    return whole, stepper, {blob: f"{state}_0" for state, blob in given.items()}


@pytest.mark.parametrize("cell", CELLS)
@settings(max_examples=8, deadline=None)
@given(cont=conts(), seed=st.integers(0, 2**16))
def test_stepping_from_given_states_equals_the_unrolled_net_at_every_cont(cell, cont, seed):
    """docs/design.md, "State from anywhere", one rule for both: a given state enters the
    first step whatever its cont, and every later cont 0 starts its row again from it."""
    whole, stepper, given = _given_pair(cell)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, N, D))
    initial = {blob: rng.normal(size=(1, N, H)) for blob in given}
    static = static_inputs(cell, N, hidden=H)
    want = whole.forward(x=x, cont=cont, **initial, **static)["h"]
    stepper.reset({given[blob]: value for blob, value in initial.items()})
    got = [stepper(x=x[t:t + 1], cont=cont[t:t + 1], **static)["h"] for t in range(T)]
    np.testing.assert_allclose(np.concatenate(got), want, atol=1e-12, err_msg=f"cont {cont}")
    assert stepper.gated_by == {state: ["cont"] for state in given.values()}


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("cell", CELLS)
@settings(max_examples=4, deadline=None)
@given(cont=conts())
def test_stepping_from_zeros_equals_the_unrolled_net_at_every_cont(cell, layers, cont):
    """After reset(), zeros are the initial state: cont 0 restarts a row from zeros, as
    the net unrolled from h_0 = 0 does (Caffe's gating), stacked layers too."""
    make = _make(cell, layers)
    whole = unroll.Net(make(T), phase="test", dtype="float64")
    stepper = Stepper(make(1), store=whole.store, dtype="float64")
    x = np.random.default_rng(0).normal(size=(T, N, D))
    zeros = {name: np.zeros((1, N, H)) for name in stepper.pairs}
    static = static_inputs(cell, N, hidden=H)
    out = whole.forward(x=x, cont=cont, **zeros, **static)
    stepper.reset()
    got = [stepper(x=x[t:t + 1], cont=cont[t:t + 1], **static)["h"] for t in range(T)]
    np.testing.assert_allclose(np.concatenate(got), out["h"], atol=1e-12)
    for name, final in stepper.pairs.items():
        np.testing.assert_allclose(stepper.state[name], out[final], atol=1e-12)


def test_a_reorder_moves_each_row_with_its_given_state():
    """After reorder(rows), row i restarts (cont 0) from the given state of row rows[i]."""
    whole, stepper, given = _given_pair("gru")
    rng = np.random.default_rng(4)
    x, start = rng.normal(size=(T, N, D)), rng.normal(size=(1, N, H))
    rows = np.array([2, 0, 1])
    cont = np.ones((T, N))
    cont[2] = 0
    want = whole.forward(x=x, cont=cont, h_given=start[:, rows])["h"]
    stepper.reset({"h_0": start})
    stepper.reorder(rows)
    got = [stepper(x=x[t:t + 1], cont=cont[t:t + 1])["h"] for t in range(T)]
    np.testing.assert_allclose(np.concatenate(got), want, atol=1e-12)


@pytest.mark.parametrize("cell", CELLS)
def test_reset_starts_from_zeros_sized_by_the_batch_of_the_next_call(cell):
    make = _make(cell, 2)
    whole = unroll.Net(make(T), phase="test", dtype="float64")
    stepper = Stepper(make(1), store=whole.store, dtype="float64")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(T, 2, D))  # a batch of 2, not the N the nets were built with
    zeros = {name: np.zeros((1, 2, H)) for name in stepper.pairs}
    static = static_inputs(cell, 2, hidden=H)
    expected = whole.forward(x=x, cont=np.ones((T, 2)), **zeros, **static)["h"]
    stepper(x=x[:1], cont=np.ones((1, 2)), **static)  # some state, then forgotten
    stepper.reset()
    got = [stepper(x=x[t:t + 1], cont=np.ones((1, 2)), **static)["h"] for t in range(T)]
    np.testing.assert_allclose(np.concatenate(got), expected, atol=1e-12)


def test_a_net_without_states_and_a_wrong_state_are_errors():
    with pytest.raises(NetError, match="expose_hidden=True"):
        Stepper(unroll.expand("lstm", steps=1, batch=N, input_dim=D, hidden=H))
    stepper = Stepper(_make("lstm", 1)(1))
    with pytest.raises(ValueError, match=r"missing \['h_0'\]"):
        stepper.reset({"c_0": np.zeros((1, N, H))})
    with pytest.raises(ValueError, match="reset"):
        stepper(x=np.zeros((1, N, D)), cont=np.ones((1, N)), h_0=np.zeros((1, N, H)))


def test_the_repr_names_the_states_and_what_it_holds():
    stepper = unroll.Stepper(_make("gru", 1)(1))
    assert repr(stepper) == "Stepper(net 'gru_T1', states ['h_0'], holding zeros)"
    stepper(x=np.zeros((1, N, D)), cont=np.ones((1, N)))
    assert repr(stepper).endswith("holding {'h_0': (1, 3, 5)})")


def test_a_state_gated_by_a_computed_cont_cannot_be_given():
    """A gate's cont computed by a layer (here 1 - cont, by a Power) is no input the
    first-step rule may set to 1: reset(state) says so instead."""
    net = _make("rnn", 1)(1)
    cut = next(lp for lp in net.layer if lp.name == "cont_slice")
    cut.bottom[0] = "cont_from_x"
    made = unroll.core.proto.LayerParameter(name="cont_from_x", type="Power", bottom=["cont"],
                                            top=["cont_from_x"])
    made.power_param.scale, made.power_param.shift = -1.0, 1.0
    net.layer.insert(1, made)
    stepper = Stepper(net)
    assert stepper.gated_by == {"h_0": []}
    with pytest.raises(NetError, match=r"no input of net .* is the cont that gates state\(s\) "
                                       r"\['h_0'\] alone"):
        stepper.reset({"h_0": np.zeros((1, N, H))})


def test_from_given_states_the_cont_checks_run_once_per_batch_shape(monkeypatch):
    """What a call checks beyond the engine (the conts' shapes against the given states)
    runs on the first call that restarts a row and again only when the batch changes."""
    _, stepper, _ = _given_pair("gru")
    checked = []
    check = Stepper._check_conts
    monkeypatch.setattr(Stepper, "_check_conts",
                        lambda self, *args: checked.append(1) or check(self, *args))
    x = np.zeros((1, N, D))
    stepper.reset({"h_0": np.ones((1, N, H))})
    for _ in range(4):
        stepper(x=x, cont=np.zeros((1, N)))
        stepper(x=x, cont=np.ones((1, N)))
    assert len(checked) == 1
    stepper.reorder([0, 1])
    stepper(x=x[:, :2], cont=np.zeros((1, 2)))
    stepper(x=x[:, :2], cont=np.zeros((1, 2)))
    assert len(checked) == 2
    with pytest.raises(ValueError, match=r"state 'h_0' is held as \(1, 2, 5\).*cont 'cont' is "
                                         r"\(1, 3\)"):
        stepper(x=x, cont=np.zeros((1, N)))


@pytest.mark.parametrize("cont", [[0.0, 0.5, 1.0], [1.0, 0.5, 1.0]])
def test_from_given_states_a_cont_other_than_0_or_1_is_an_error(cont):
    _, stepper, _ = _given_pair("gru")
    stepper.reset({"h_0": np.ones((1, N, H))})
    with pytest.raises(NetError, match=r"input 'cont' holds 0.5 at index \(0, 1\)"):
        stepper(x=np.zeros((1, N, D)), cont=np.array([cont]))


def _attending(store=None):
    return Stepper(unroll.expand("lstm_attention", steps=1, batch=N, input_dim=D, hidden=H,
                                 expose_hidden=True), store=store, dtype="float64")


def test_static_inputs_set_once_give_what_they_give_on_every_call():
    """set_static copies a memory into the net once; every later call reads it as a call
    that is given it does, bit for bit, though the caller's array changes after."""
    each = _attending()
    once = _attending(store=each.store)
    static = static_inputs("lstm_attention", N, hidden=H)
    rng = np.random.default_rng(5)
    x, cont = rng.normal(size=(T, N, D)), np.ones((T, N))
    cont[3] = 0
    want = [each(x=x[t:t + 1], cont=cont[t:t + 1], **static)["h"] for t in range(T)]
    given = {name: value.copy() for name, value in static.items()}
    once.set_static(**given)
    for value in given.values():
        value[...] = 0  # set_static copied them
    got = [once(x=x[t:t + 1], cont=cont[t:t + 1])["h"] for t in range(T)]
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(want))
    assert once.static == {"memory", "memory_mask"}
    with pytest.raises(ValueError, match=r"\['memory'\] are static inputs \(set_static\)"):
        once(x=x[:1], cont=cont[:1], memory=static["memory"])


def test_a_static_input_is_neither_a_state_nor_a_cont_nor_a_stranger():
    stepper = _attending()
    with pytest.raises(ValueError, match=r"'h_0' is a state .* reset\(\{'h_0': \.\.\.\}\)"):
        stepper.set_static(h_0=np.zeros((1, N, H)))
    with pytest.raises(ValueError, match=r"'cont' gates state\(s\) \['c_0', 'h_0'\]"):
        stepper.set_static(cont=np.ones((1, N)))
    with pytest.raises(ValueError, match="'y' is not an input of the step net"):
        stepper.set_static(y=np.ones(1))
    assert stepper.static == frozenset()


def test_an_input_the_net_writes_in_place_is_not_static():
    net = _make("gru", 1)(1)
    relu = unroll.core.proto.LayerParameter(name="relu", type="ReLU", bottom=["x"], top=["x"])
    net.layer.insert(1, relu)
    with pytest.raises(ValueError, match="writes into input 'x' in place"):
        Stepper(net).set_static(x=np.zeros((1, N, D)))
