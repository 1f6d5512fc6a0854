import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError
from unroll.core.proto import LayerParameter, parse_text
from unroll.engine.blob import Blob
from unroll.engine.layer import layer_class
from unroll.testing import shapes


def build(spec, n_bottoms, n_tops, xp=np):
    param = parse_text(spec, LayerParameter())
    layer = layer_class(param)(param, xp=xp, dtype=np.float64)
    bottoms = [Blob((2, 3), xp, np.float64, f"in{i}") for i in range(n_bottoms)]
    tops = [Blob((), xp, np.float64, f"out{i}") for i in range(n_tops)]
    layer.set_up(bottoms, tops)
    return layer, bottoms, tops


def shape_text(shape):
    return "shape { " + " ".join(f"dim: {d}" for d in shape) + " }"


@given(shape=shapes(min_dims=0), k=st.integers(1, 3))
def test_input_one_shape_for_all_tops(shape, k):
    tops_ = " ".join(f'top: "x{i}"' for i in range(k))
    _, _, tops = build(f'type: "Input" {tops_} input_param {{ {shape_text(shape)} }}', 0, k)
    assert [t.shape for t in tops] == [shape] * k


@given(shapes_=st.lists(shapes(min_dims=0), min_size=2, max_size=3))
def test_input_one_shape_per_top(shapes_):
    param = " ".join(shape_text(s) for s in shapes_)
    tops_ = " ".join(f'top: "x{i}"' for i in range(len(shapes_)))
    _, _, tops = build(f'type: "Input" {tops_} input_param {{ {param} }}', 0, len(shapes_))
    assert [t.shape for t in tops] == shapes_


def test_input_keeps_a_shape_given_from_outside(xp):
    layer, bottoms, tops = build('type: "Input" input_param { shape { dim: 2 } }', 0, 1, xp)
    tops[0].reshape((5, 4))
    tops[0].data[...] = 3.0
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    layer.backward(tops, [], bottoms)
    assert tops[0].shape == (5, 4) and float(tops[0].data.sum()) == 60.0


def test_input_shape_count_must_fit_the_tops():
    spec = ('name: "in" type: "Input" top: "a" top: "b" top: "c" '
            "input_param { shape { dim: 1 } shape { dim: 2 } }")
    with pytest.raises(NetError, match="'in'.*2 input_param shapes for 3 tops"):
        build(spec, 0, 3)


def test_input_takes_no_bottoms():
    with pytest.raises(NetError, match="'in'"):
        build('name: "in" type: "Input"', 1, 1)


def test_silence_zeroes_only_the_diffs_asked_for(xp):
    layer, bottoms, tops = build('type: "Silence"', 3, 0, xp)
    assert tops == []
    for b in bottoms:
        b.diff[...] = 1.0
    layer.forward(bottoms, tops)
    layer.backward(tops, [True, False, True], bottoms)
    assert [float(b.diff.sum()) for b in bottoms] == [0.0, 6.0, 0.0]
