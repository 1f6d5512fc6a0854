import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.core.proto import LayerParameter, parse_text
from unroll.engine.backend import to_numpy
from unroll.engine.layer import layer_class
from unroll.testing import run_layer as run


def spec(op, coeff=(), stable=True):
    coeffs = " ".join(f"coeff: {c}" for c in coeff)
    return (
        f'name: "elt" type: "Eltwise" eltwise_param {{ operation: {op} {coeffs} '
        f"stable_prod_grad: {str(stable).lower()} }}"
    )


@given(data=st.data())
def test_gradient_sum(data):
    shape = data.draw(testing.shapes(max_dims=3))
    n = data.draw(st.integers(2, 3), "bottoms")
    coeff = data.draw(
        st.one_of(
            st.just(()), st.lists(st.sampled_from([1, -1, 0.5, -2.5, 0]), min_size=n, max_size=n)
        ),
        "coeff",
    )
    bottoms = [data.draw(testing.arrays(shape), f"x{i}") for i in range(n)]
    testing.check_layer_gradient(spec("SUM", coeff), bottoms)


@given(data=st.data())
def test_gradient_prod(data):
    shape = data.draw(testing.shapes(max_dims=3))
    n = data.draw(st.integers(2, 3), "bottoms")
    stable = data.draw(st.booleans(), "stable_prod_grad")
    # the unstable gradient divides by x: keep the bottoms away from 0
    bottoms = [
        data.draw(testing.arrays(shape, away_from=[0.0], margin=0.1), f"x{i}") for i in range(n)
    ]
    testing.check_layer_gradient(spec("PROD", stable=stable), bottoms)


@given(data=st.data())
def test_gradient_max(data):
    shape = data.draw(testing.shapes(max_dims=3))
    n = data.draw(st.integers(2, 3), "bottoms")
    # entries distinct across all bottoms, so the argmax is stable under finite differences
    stacked = data.draw(testing.distinct_arrays((n,) + shape), "x")
    testing.check_layer_gradient(spec("MAX"), list(stacked))


@pytest.mark.parametrize(
    "op, coeff, want",
    [
        ("SUM", (), lambda a, b, c: a + b + c),
        ("SUM", (2, -1, 0.5), lambda a, b, c: 2 * a - b + c / 2),
        ("PROD", (), lambda a, b, c: a * b * c),
        ("MAX", (), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    ],
)
def test_forward_matches_numpy(xp, op, coeff, want):
    a, b, c = np.random.default_rng(0).normal(size=(3, 2, 3, 4))
    _, _, tops = run(spec(op, coeff), [a, b, c], xp)
    np.testing.assert_allclose(to_numpy(tops[0].data), want(a, b, c), rtol=1e-14)


def test_max_gives_the_gradient_to_the_first_maximum(xp):
    a, b, c = np.array([1.0, 5.0, 2.0]), np.array([1.0, 0.0, 3.0]), np.array([0.0, 5.0, 3.0])
    layer, bs, tops = run(spec("MAX"), [a, b, c], xp)
    np.testing.assert_array_equal(to_numpy(tops[0].data), [1, 5, 3])
    tops[0].diff[...] = xp.asarray([10.0, 20.0, 30.0])
    layer.backward(tops, [True, True, True], bs)
    np.testing.assert_array_equal(to_numpy(bs[0].diff), [10, 20, 0])
    np.testing.assert_array_equal(to_numpy(bs[1].diff), [0, 0, 30])
    np.testing.assert_array_equal(to_numpy(bs[2].diff), [0, 0, 0])


@pytest.mark.parametrize(
    "op, stable, reads",
    [
        ("SUM", True, ()),
        ("MAX", True, ()),
        ("PROD", True, ("bottom",)),
        ("PROD", False, ("bottom", "top")),
    ],
)
def test_backward_reads(op, stable, reads):
    layer, *_ = run(spec(op, stable=stable), [np.ones(2), np.ones(2)])
    assert layer.backward_reads == reads


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(
        NetError, match=r"layer 'elt' \(Eltwise\).*'bottom0' is \(2, 3\).*'bottom1' is \(3, 2\)"
    ):
        run(spec("SUM"), [np.zeros((2, 3)), np.zeros((3, 2))])


@pytest.mark.parametrize(
    "text, message",
    [
        (spec("SUM", (1, 2, 3)), "3 coeff given for 2 bottoms"),
        (spec("PROD", (1, 2)), "coeff is only allowed with operation SUM"),
    ],
)
def test_bad_coefficients(text, message):
    with pytest.raises(NetError, match=rf"layer 'elt' \(Eltwise\): {message}"):
        run(text, [np.zeros(2), np.zeros(2)])


def test_one_bottom_is_an_error():
    param = parse_text(spec("SUM"), LayerParameter())
    with pytest.raises(NetError, match=r"layer 'elt' \(Eltwise\): takes 2..any bottoms, found 1"):
        layer_class(param)(param).check_counts(1, 1)
