import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.core.proto import LayerParameter, parse_text
from unroll.engine.backend import to_numpy
from unroll.engine.blob import Blob
from unroll.engine.layer import layer_class


def forward(spec, x, phase="train", xp=np):
    param = parse_text(spec, LayerParameter())
    layer = layer_class(param)(param, xp=xp, dtype=np.float64, phase=phase)
    bottom, top = Blob(x.shape, xp, np.float64, "x"), Blob((), xp, np.float64, "y")
    bottom.data[...] = xp.asarray(x)
    layer.set_up([bottom], [top])
    layer.forward([bottom], [top])
    return layer, to_numpy(top.data)


@given(x=testing.arrays(testing.shapes(), away_from=[0.0]), slope=st.sampled_from([0, 0.01, 0.5]))
def test_relu_gradient(x, slope):
    testing.check_layer_gradient(f'type: "ReLU" relu_param {{ negative_slope: {slope} }}', [x])


@given(x=testing.arrays(testing.shapes(), -6, 6))
def test_sigmoid_gradient(x):
    testing.check_layer_gradient('type: "Sigmoid"', [x])


@given(x=testing.arrays(testing.shapes(), -3, 3))
def test_tanh_gradient(x):
    testing.check_layer_gradient('type: "TanH"', [x])


@given(x=testing.arrays(testing.shapes()), ratio=st.sampled_from([0.0, 0.2, 0.5, 0.9]),
       seed=st.integers(0, 1000))
def test_dropout_gradient(x, ratio, seed):
    testing.check_layer_gradient(f'type: "Dropout" dropout_param {{ dropout_ratio: {ratio} }}',
                                 [x], seed=seed)


@given(x=testing.arrays(testing.shapes(), 0.2, 2.0),
       power=st.sampled_from([1.0, 2.0, 3.0, 0.5, -1.0]),
       scale=st.sampled_from([1.0, 0.5, 2.0, 0.0, -1.0]),
       shift=st.sampled_from([0.0, 1.0, 3.0]))
def test_power_gradient(x, power, scale, shift):
    if power != int(power) or power < 0:
        scale, shift = abs(scale), shift + 0.5  # keep the base positive
    testing.check_layer_gradient(
        f'type: "Power" power_param {{ power: {power} scale: {scale} shift: {shift} }}', [x])


def test_forward_values(xp):
    x = np.array([[-2.0, -0.5, 0.0, 0.5, 3.0]])
    np.testing.assert_allclose(forward('type: "ReLU"', x, xp=xp)[1], np.maximum(x, 0))
    leaky = forward('type: "ReLU" relu_param { negative_slope: 0.1 }', x, xp=xp)[1]
    np.testing.assert_allclose(leaky, np.where(x > 0, x, 0.1 * x))
    np.testing.assert_allclose(forward('type: "Sigmoid"', x, xp=xp)[1], 1 / (1 + np.exp(-x)))
    np.testing.assert_allclose(forward('type: "TanH"', x, xp=xp)[1], np.tanh(x))
    power = forward('type: "Power" power_param { power: 2 scale: -1 shift: 1 }', x, xp=xp)[1]
    np.testing.assert_allclose(power, (1 - x) ** 2)
    one_minus = forward('type: "Power" power_param { scale: -1 shift: 1 }', x, xp=xp)[1]
    np.testing.assert_allclose(one_minus, 1 - x)


def test_sigmoid_does_not_overflow():
    y = forward('type: "Sigmoid"', np.array([-1e4, 1e4]))[1]
    np.testing.assert_array_equal(y, [0.0, 1.0])


def test_dropout_scales_kept_units_and_passes_through_at_test_time():
    x = np.ones((200, 50))
    layer, y = forward('type: "Dropout" dropout_param { dropout_ratio: 0.25 }', x)
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1 / 0.75)
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_array_equal(forward('type: "Dropout"', x, phase="test")[1], x)


@pytest.mark.parametrize("spec", [
    'name: "bad" type: "ReLU" relu_param { negative_slope: -1 }',
    'name: "bad" type: "Dropout" dropout_param { dropout_ratio: 1 }',
])
def test_bad_parameters_name_the_layer(spec):
    with pytest.raises(NetError, match="'bad'"):
        forward(spec, np.ones((2, 2)))
