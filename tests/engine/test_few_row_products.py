"""The CPU runs an InnerProduct of a few rows (one unrolled timestep's batch) as the
transposed product (unroll.engine.layers.inner_product.FEW_ROWS, for weights at least
FEW_ROWS_MIN_WIDTH wide): an unrolled net must give the plain products' loss, outputs and
gradients, for every built-in cell, stacked, bidirectional and with sequences packed back
to back (cont 0 inside a column). The tests lower the width bound to reach the path at
small sizes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unroll import Net, expand, to_prototxt
from unroll.engine.layers import inner_product
from unroll.testing import builtin_templates

CELLS = builtin_templates("step")
TOLERANCE = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-12, atol=1e-13)}


def run(cell, direction, layers, dtype, x, cont, target, transpose):
    T, N, D = x.shape
    H = 3
    unrolled = expand(cell, steps=T, batch=N, input_dim=D, hidden=H, direction=direction,
                      layers=layers)
    text = "force_backward: true\n" + to_prototxt(unrolled)
    out = target.shape[-1]
    text += f"""
layer {{ name: "target" type: "Input" top: "target"
        input_param {{ shape {{ dim: {T} dim: {N} dim: {out} }} }} }}
layer {{ name: "head" type: "InnerProduct" bottom: "h" top: "y"
        inner_product_param {{ num_output: {out} axis: 2 transpose: {str(transpose).lower()}
                              weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "target" top: "loss" }}
"""
    net = Net(text, dtype=dtype, seed=7, keep=("x", "h"))
    net.clear_param_diffs()
    net.forward(x=x, cont=cont, target=target)
    net.backward()
    grads = {p.name: p.diff.copy() for p in net.learnable_params}
    return net.loss, net.blobs["h"].data.copy(), net.blobs["x"].diff.copy(), grads


@settings(max_examples=30, deadline=None)
@given(cell=st.sampled_from(CELLS), direction=st.sampled_from(["forward", "bidirectional"]),
       layers=st.integers(1, 2), dtype=st.sampled_from(["float32", "float64"]),
       T=st.integers(1, 5), N=st.integers(1, 4), transpose=st.booleans(),
       seed=st.integers(0, 2**16), data=st.data())
def test_few_row_products_give_the_plain_products(cell, direction, layers, dtype, T, N,
                                                  transpose, seed, data):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, N, 2))
    # sequences packed back to back: a 0 starts one, anywhere in a column
    cont = np.array(data.draw(st.lists(st.lists(st.sampled_from([0, 1]), min_size=N,
                                                max_size=N), min_size=T, max_size=T)), float)
    cont[0] = 0
    out = 2 * 3 if direction == "bidirectional" else 3
    target = rng.normal(size=(T, N, out))
    args = (cell, direction, layers, dtype, x, cont, target, transpose)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inner_product, "FEW_ROWS_MIN_WIDTH", 1)  # every few-row product
        fast = run(*args)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inner_product, "FEW_ROWS", 0)  # every product the plain one
        plain = run(*args)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(fast[0], plain[0], **tol)
    np.testing.assert_allclose(fast[1], plain[1], **tol)
    np.testing.assert_allclose(fast[2], plain[2], **tol)
    assert fast[3].keys() == plain[3].keys()
    for name, diff in fast[3].items():
        np.testing.assert_allclose(diff, plain[3][name], **tol, err_msg=name)


def few_rows_by_layer(net):
    return {layer.name: layer.few_rows for layer in net.layers if layer.type == "InnerProduct"}


def test_a_timesteps_rows_take_the_transposed_product_and_a_sequences_the_plain_one():
    """The rule itself: N = 32 rows per step go the transposed way, T * N = 800 rows not."""
    few = few_rows_by_layer(Net(expand("lstm", steps=25, batch=32, input_dim=4, hidden=64)))
    assert few.pop("x_proj_seq") is False
    assert set(few.values()) == {True} and len(few) == 25


def test_narrow_weights_take_the_plain_product():
    """Weights narrower than the bound (64 inputs to 4 * 16 gates here) stay plain at any M."""
    few = few_rows_by_layer(Net(expand("lstm", steps=3, batch=2, input_dim=4, hidden=16)))
    assert set(few.values()) == {False}
