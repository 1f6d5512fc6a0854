import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unroll import NetError
from unroll.engine.backend import to_numpy
from unroll.engine.blob import Blob
from unroll.testing import arrays, check_layer_gradient, shapes
from unroll.testing import run_layer as run

with_xp = settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)




def tops_text(k):
    return " ".join(f'top: "y{i}"' for i in range(k))


@st.composite
def concat_cases(draw):
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=3))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    values = []
    for size in sizes:
        s = list(shape)
        s[axis] = size
        values.append(draw(arrays(tuple(s))))
    legacy = axis >= 0 and draw(st.booleans())
    return values, (f"concat_dim: {axis}" if legacy else f"axis: {axis}"), axis


@with_xp
@given(case=concat_cases())
def test_concat_forward_and_gradient(xp, case):
    values, field, axis = case
    bottoms = " ".join(f'bottom: "x{i}"' for i in range(len(values)))
    spec = f'name: "cat" type: "Concat" {bottoms} concat_param {{ {field} }}'
    _, _, tops = run(spec, values, xp)
    np.testing.assert_array_equal(to_numpy(tops[0].data), np.concatenate(values, axis=axis))
    check_layer_gradient(spec, values, xp=xp)


@st.composite
def slice_cases(draw):
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    size = shape[axis]
    if draw(st.booleans()) or size == 1:
        k = draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
        points = []
    else:
        points = sorted(draw(st.sets(st.integers(1, size - 1), min_size=1)))
        k = len(points) + 1
    legacy = axis >= 0 and draw(st.booleans())
    field = f"slice_dim: {axis}" if legacy else f"axis: {axis}"
    field += "".join(f" slice_point: {p}" for p in points)
    return draw(arrays(shape)), field, axis, k, points


@with_xp
@given(case=slice_cases())
def test_slice_forward_and_gradient(xp, case):
    x, field, axis, k, points = case
    spec = f'name: "cut" type: "Slice" {tops_text(k)} slice_param {{ {field} }}'
    _, _, tops = run(spec, [x], xp, n_tops=k)
    expected = np.split(x, points or k, axis=axis)
    for top, want in zip(tops, expected, strict=True):
        np.testing.assert_array_equal(to_numpy(top.data), want)
    check_layer_gradient(spec, [x], xp=xp)


@with_xp
@given(x=arrays(shapes(max_dims=3)), k=st.integers(1, 4))
def test_split_shares_data_and_sums_diffs(xp, x, k):
    spec = f'name: "fan" type: "Split" {tops_text(k)}'
    _, bottoms, tops = run(spec, [x], xp, n_tops=k)
    for top in tops:
        assert top.data is bottoms[0].data
        assert top.diff is not bottoms[0].diff
    check_layer_gradient(spec, [x], xp=xp)


def test_split_follows_a_replaced_bottom_array():
    layer, bottoms, tops = run('type: "Split" top: "a" top: "b"', [np.ones((2, 3))], n_tops=2)
    bottoms[0].data = np.full((2, 3), 7.0)
    layer.forward(bottoms, tops)
    assert all(t.data is bottoms[0].data for t in tops)


def test_unrolled_round_trip_keeps_buffers(xp):
    # (T, N, D) cut into T steps along axis 0 and joined back; reshaping again with the
    # same shapes must not reallocate the tops
    T, N, D = 4, 2, 3
    x = np.arange(T * N * D, dtype=np.float64).reshape(T, N, D)
    spec = f'type: "Slice" {tops_text(T)} slice_param {{ axis: 0 }}'
    cut, _, steps = run(spec, [x], xp, n_tops=T)
    _, _, out = run('type: "Concat" concat_param { axis: 0 }', [to_numpy(s.data) for s in steps],
                    xp)
    np.testing.assert_array_equal(to_numpy(out[0].data), x)
    before = [s.data for s in steps]
    cut.reshape([Blob((T, N, D), xp, np.float64)], steps)
    assert all(a is b.data for a, b in zip(before, steps))


@pytest.mark.parametrize(
    "spec, shapes_, n_tops, match",
    [
        ('name: "c1" type: "Concat" concat_param { axis: 1 }', [(2, 3), (3, 3)], 1, "c1"),
        ('name: "c2" type: "Concat" concat_param { axis: 2 }', [(2, 3), (2, 3)], 1, "c2"),
        ('name: "c3" type: "Concat" concat_param { axis: 0 concat_dim: 0 }', [(2,), (2,)], 1,
         "not both"),
        ('name: "c4" type: "Concat"', [(2, 3), (2, 3, 1)], 1, "c4"),
        ('name: "s1" type: "Slice" top: "a" top: "b" slice_param { axis: 0 }', [(3, 2)], 2,
         "equal parts"),
        ('name: "s2" type: "Slice" top: "a" top: "b" slice_param { axis: 0 slice_point: 3 }',
         [(3, 2)], 2, "s2"),
        ('name: "s3" type: "Slice" top: "a" top: "b" slice_param { axis: 0 slice_point: 1 '
         "slice_point: 2 }", [(3, 2)], 2, "s3"),
        ('name: "s4" type: "Slice" top: "a" top: "b" top: "c" slice_param { axis: 0 '
         "slice_point: 2 slice_point: 1 }", [(3, 2)], 3, "s4"),
        ('name: "s5" type: "Slice" top: "a" slice_param { slice_dim: 2 }', [(3, 2)], 1, "s5"),
    ],
)
def test_bad_shapes_name_the_layer(spec, shapes_, n_tops, match):
    with pytest.raises(NetError, match=match):
        run(spec, [np.zeros(s) for s in shapes_], n_tops=n_tops)
