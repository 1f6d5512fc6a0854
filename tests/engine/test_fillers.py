"""Weight fillers: Caffe's names, parameters and statistics (fan_in / fan_out / average)."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import testing
from unroll.core.proto import FillerParameter, parse_text
from unroll.engine.fillers import FILLERS, fill

MIN_COUNT = 20_000  # samples per draw: variances to about 1%, so 6% tolerances never flake
NORMS = {
    "FAN_IN": FillerParameter.FAN_IN,
    "FAN_OUT": FillerParameter.FAN_OUT,
    "AVERAGE": FillerParameter.AVERAGE,
}


@st.composite
def big_shapes(draw):
    """Shapes of 2 to 4 axes holding at least MIN_COUNT values, leading axes drawn freely."""
    lead = draw(st.lists(st.integers(1, 40), min_size=1, max_size=3))
    return (*lead, -(-MIN_COUNT // math.prod(lead)))


def caffe_fans(shape):
    """Caffe's XavierFiller/MSRAFiller: fan_in = count / num, fan_out = count / channels."""
    count = math.prod(shape)
    return count / shape[0], (count / shape[1] if len(shape) > 1 else count)


def expected_n(shape, norm):
    fan_in, fan_out = caffe_fans(shape)
    return {"FAN_IN": fan_in, "FAN_OUT": fan_out, "AVERAGE": (fan_in + fan_out) / 2}[norm]


def draw_values(filler, shape, seed=0, dtype=np.float64):
    out = fill(filler, shape, np.random.default_rng(seed), dtype)
    assert out.shape == tuple(shape) and out.dtype == dtype
    return out


def assert_moments(values, mean, var):
    n = values.size
    assert abs(values.mean() - mean) < 6 * math.sqrt(var / n) + 1e-12
    assert values.var() == pytest.approx(var, rel=0.06)


@given(
    shape=testing.shapes(min_dims=0), value=st.floats(-5, 5), dtype=st.sampled_from(["f4", "f8"])
)
def test_constant(shape, value, dtype):
    out = draw_values(FillerParameter(type="constant", value=value), shape, dtype=np.dtype(dtype))
    np.testing.assert_array_equal(out, np.full(shape, np.float32(value), dtype))  # float field


def test_default_filler_is_constant_zero():
    assert FillerParameter().type == "constant"
    assert not draw_values(FillerParameter(), (3, 4)).any()
    assert not draw_values(None, (3, 4)).any()


@given(shape=big_shapes(), low=st.floats(-3, 3), width=st.floats(0.1, 4), seed=st.integers(0, 99))
def test_uniform(shape, low, width, seed):
    high = low + width
    out = draw_values(FillerParameter(type="uniform", min=low, max=high), shape, seed)
    lo, hi = np.float32(low), np.float32(high)  # the message stores float32
    assert out.min() >= lo and out.max() <= hi
    assert_moments(out, (lo + hi) / 2, (hi - lo) ** 2 / 12)


@given(shape=big_shapes(), mean=st.floats(-3, 3), std=st.floats(0.01, 3), seed=st.integers(0, 99))
def test_gaussian(shape, mean, std, seed):
    out = draw_values(FillerParameter(type="gaussian", mean=mean, std=std), shape, seed)
    assert_moments(out, float(np.float32(mean)), float(np.float32(std)) ** 2)


@given(shape=big_shapes(), norm=st.sampled_from(sorted(NORMS)), seed=st.integers(0, 99))
def test_xavier(shape, norm, seed):
    out = draw_values(FillerParameter(type="xavier", variance_norm=NORMS[norm]), shape, seed)
    n = expected_n(shape, norm)
    bound = math.sqrt(3 / n)
    assert np.abs(out).max() <= bound * (1 + 1e-12)
    assert np.abs(out).max() >= 0.99 * bound  # the bound itself, not a narrower one
    assert_moments(out, 0.0, 1 / n)


@given(shape=big_shapes(), norm=st.sampled_from(sorted(NORMS)), seed=st.integers(0, 99))
def test_msra(shape, norm, seed):
    out = draw_values(FillerParameter(type="msra", variance_norm=NORMS[norm]), shape, seed)
    assert_moments(out, 0.0, 2 / expected_n(shape, norm))


@pytest.mark.parametrize(
    "shape, norm, n",
    [
        ((10, 20, 100), "FAN_IN", 2000),  # count / num
        ((10, 20, 100), "FAN_OUT", 1000),  # count / channels
        ((10, 20, 100), "AVERAGE", 1500),
        ((100, 200), "FAN_IN", 200),
        ((100, 200), "FAN_OUT", 100),
        ((20000,), "FAN_IN", 1),  # a 1-D blob: fan_in = count / num = 1, fan_out = count
        ((20000,), "FAN_OUT", 20000),
    ],
)
def test_xavier_and_msra_fans_follow_caffe(shape, norm, n):
    x = draw_values(FillerParameter(type="xavier", variance_norm=NORMS[norm]), shape)
    assert np.abs(x).max() == pytest.approx(math.sqrt(3 / n), rel=1e-2)
    m = draw_values(FillerParameter(type="msra", variance_norm=NORMS[norm]), shape)
    assert m.std() == pytest.approx(math.sqrt(2 / n), rel=0.03)


def test_xavier_default_is_fan_in():
    assert FillerParameter().variance_norm == FillerParameter.FAN_IN
    shape = (10, 20, 100)
    a = draw_values(FillerParameter(type="xavier"), shape)
    b = draw_values(FillerParameter(type="xavier", variance_norm=FillerParameter.FAN_IN), shape)
    np.testing.assert_array_equal(a, b)


@given(spec=testing.fillers(), shape=testing.shapes(), seed=st.integers(0, 2**32 - 1))
def test_same_seed_same_values(spec, shape, seed):
    filler = parse_text(spec, FillerParameter())
    a = draw_values(filler, shape, seed, np.float32)
    b = draw_values(filler, shape, seed, np.float32)
    np.testing.assert_array_equal(a, b)
    assert np.isfinite(a).all()
    assert filler.type in FILLERS


@given(spec=testing.fillers(), shape=testing.shapes(min_dims=0, min_side=0))
def test_empty_and_scalar_blobs(spec, shape):
    # a blob with a 0-sized axis has fan 0: still an (empty) array, not a ZeroDivisionError
    out = draw_values(parse_text(spec, FillerParameter()), shape)
    assert np.isfinite(out).all()


def test_unknown_filler_type():
    with pytest.raises(ValueError, match="'bilinear'"):
        fill(FillerParameter(type="bilinear"), (2, 2), np.random.default_rng(0), np.float32)


def test_sparse_gaussian_is_refused():
    with pytest.raises(ValueError, match="sparse"):
        fill(FillerParameter(type="gaussian", sparse=2), (4, 4), np.random.default_rng(0), "f4")
