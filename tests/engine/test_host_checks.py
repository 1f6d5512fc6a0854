"""Host checks of a net's inputs: decided once per net, run on every value set."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import Net, NetError
from unroll.engine import host_checks
from unroll.engine import net as net_module
from unroll.engine.layer import Layer, register_layer

CHECKED: list = []  # (bottom index, input name, the values) of every check made


@register_layer("TestCountHostChecks")
class CountHostChecks(Layer):
    """y = x; records each host check of its bottom and refuses negative values."""

    checks_host_bottoms = True
    backward_reads = ()

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)

    def forward(self, bottoms, tops):
        tops[0].data[...] = bottoms[0].data

    def check_host_bottom(self, index, values, name):
        CHECKED.append((index, name, values.copy()))
        if (values < 0).any():
            raise self.error(f"bottom '{name}' holds a negative value")


#: ids read by the counter and by an Embed, through a split; a cont read by a Scale
NET = '''
  layer { name: "in" type: "Input" top: "ids" top: "cont"
          input_param { shape { dim: 1 dim: 2 } shape { dim: 1 dim: 2 } } }
  layer { name: "count" type: "TestCountHostChecks" bottom: "ids" top: "same" }
  layer { name: "e" type: "Embed" bottom: "ids" top: "v"
          embed_param { num_output: 3 input_dim: 5 } }
  layer { name: "s" type: "Scale" bottom: "v" bottom: "cont" top: "w"
          scale_param { axis: 0 } }'''


@pytest.fixture
def net():
    CHECKED.clear()
    return Net(NET, phase="test")


def test_the_checks_of_each_input_are_made_once_per_net(net, monkeypatch):
    made = []
    real = host_checks.host_checks_of
    monkeypatch.setattr(net_module, "host_checks_of",
                        lambda readers, name: made.append(name) or real(readers, name))
    for k in range(4):
        net.forward(ids=np.full((1, 2), k % 5), cont=np.ones((1, 2)))
    net.forward(ids=np.zeros((1, 3)), cont=np.ones((1, 3)))  # a new shape: the same checks
    assert sorted(made) == ["cont", "ids"]


@given(st.lists(st.lists(st.integers(0, 4), min_size=2, max_size=2), min_size=1, max_size=5))
def test_every_value_set_is_checked_once(rows):
    net = Net(NET, phase="test")
    CHECKED.clear()
    for row in rows:
        net.forward(ids=np.array([row]), cont=np.ones((1, 2)))
    assert [(k, name, values.tolist()) for k, name, values in CHECKED] == [
        (0, "ids", [[float(v) for v in row]]) for row in rows]


def test_a_bad_value_is_refused_on_any_call_not_only_the_first(net):
    net.forward(ids=np.array([[1, 2]]), cont=np.ones((1, 2)))
    with pytest.raises(NetError, match="layer 'count'.*bottom 'ids' holds a negative value"):
        net.forward(ids=np.array([[1, -2]]), cont=np.ones((1, 2)))
    with pytest.raises(NetError, match=r"layer 'e' \(Embed\): bottom 'ids' holds 5.0 at index "
                                       r"\(0, 1\); expected an integer in \[0, 5\)"):
        net.forward(ids=np.array([[1, 5]]), cont=np.ones((1, 2)))
    with pytest.raises(NetError, match=r"input 'cont' holds 0.5 at index \(0, 1\)"):
        net.forward(ids=np.array([[1, 2]]), cont=np.array([[1.0, 0.5]]))
    with pytest.raises(NetError, match=r"input 'cont' holds nan at index \(0, 0\)"):
        net.forward(ids=np.array([[1, 2]]), cont=np.array([[np.nan, 1.0]]))
    net.forward(ids=np.array([[4, 0]]), cont=np.array([[0.0, 1.0]]))


def test_an_unknown_input_is_named_with_the_inputs(net):
    with pytest.raises(NetError, match=r"'idz' is not an input of this net; inputs: "
                                       r"\['ids', 'cont'\]"):
        net.set_input("idz", np.zeros((1, 2)))


def test_check_inputs_checks_as_set_input_does(net):
    CHECKED.clear()
    net.check_inputs(ids=np.array([[1, 2]]), cont=np.ones((1, 2)))
    assert [(k, name) for k, name, _ in CHECKED] == [(0, "ids")]
    with pytest.raises(NetError, match="input 'cont' holds 2.0"):
        net.check_inputs(cont=np.array([[1.0, 2.0]]))


@pytest.mark.parametrize("value", [0.0, 1.0, -0.0])
def test_a_cont_of_zeros_and_ones_passes(value):
    host_checks.check_cont("cont", np.full((2, 3), value))


@pytest.mark.parametrize("value", [0.5, -1.0, 2.0, np.inf, -np.inf, np.nan, 1e-30])
def test_a_cont_of_anything_else_is_refused(value):
    values = np.ones((2, 3))
    values[1, 2] = value
    with pytest.raises(NetError, match=r"input 'cont' holds .* at index \(1, 2\)"):
        host_checks.check_cont("cont", values)
