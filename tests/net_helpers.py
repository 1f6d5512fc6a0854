"""Prototxt builders and run helpers for the tests that build and run nets."""

import numpy as np

from unroll.engine.backend import to_numpy
from unroll.engine.net import Net

GAUSS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'


def ip(name, bottom, top, n, extra=""):
    """An InnerProduct layer with random weights and bias."""
    return (
        f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{top}" {extra}\n'
        f"  inner_product_param {{ num_output: {n} {GAUSS} }} }}\n"
    )


def inputs(**shapes):
    """One Input layer named "in" with a top per keyword, of the given shapes."""
    tops = " ".join(f'top: "{n}"' for n in shapes)
    dims = " ".join("shape { " + " ".join(f"dim: {d}" for d in s) + " }" for s in shapes.values())
    return f'layer {{ name: "in" type: "Input" {tops} input_param {{ {dims} }} }}\n'


def layer(name, type_, bottom, top, extra=""):
    return f'layer {{ name: "{name}" type: "{type_}" bottom: "{bottom}" top: "{top}" {extra} }}\n'


def loss(bottom, target="t", name="loss"):
    return (
        f'layer {{ name: "{name}" type: "EuclideanLoss" bottom: "{bottom}" bottom: "{target}" '
        f'top: "{name}" }}\n'
    )


def f64(text, **kwargs):
    return Net(text, dtype="float64", **kwargs)


def host(array):
    return to_numpy(array).copy()


def param_diffs(net):
    return {p.name: host(p.blob.diff) for p in net.learnable_params}


def run(net, **values):
    """One iteration: clear param diffs, forward, backward; returns the loss."""
    net.clear_param_diffs()
    net.forward(**values)
    net.backward()
    return net.loss


rng = np.random.default_rng(0)
X = rng.normal(size=(4, 3))
T2 = rng.normal(size=(4, 2))


SIMPLE = inputs(x=(4, 3), t=(4, 2)) + ip("ip", "x", "y", 2) + loss("y")

BN_RELU = (
    inputs(x=(4, 3))
    + layer("bn", "BatchNorm", "x", "bn")
    + layer("relu", "ReLU", "bn", "bn")
    + layer("out", "Scale", "bn", "y", "param { lr_mult: 0 }")
)


def assert_names(error, *names):
    for name in names:
        assert f"'{name}'" in str(error.value), (name, str(error.value))


def outputs_and_gradients(net, x, cont, dh):
    """h of a net with inputs x and cont, and every gradient (x's and the params') after
    backward from the diff ``dh`` of h (the nets have no loss: the test sets h's diff)."""
    h = net.forward(x=x, cont=cont)["h"].copy()
    net.clear_param_diffs()
    net.blobs["h"].diff[...] = dh
    net.backward()
    return h, {"x": net.blobs["x"].diff.copy(),
               **{p.name: p.blob.diff.copy() for p in net.learnable_params}}


def assert_nets_agree(reference, net, rng, cont):
    """``net`` has ``reference``'s params, by name and shape, in the same order, and given the
    same random values, a random x, ``cont`` and a random diff of h, it gives the same h and
    gradients (:func:`outputs_and_gradients`) as ``reference``."""
    assert ([(p.name, p.blob.shape) for p in net.learnable_params]
            == [(p.name, p.blob.shape) for p in reference.learnable_params])
    for p, q in zip(reference.learnable_params, net.learnable_params):
        p.blob.data[...] = q.blob.data[...] = rng.uniform(-0.8, 0.8, p.blob.shape)
    x = rng.uniform(-1, 1, reference.blobs["x"].shape)
    dh = rng.uniform(-1, 1, reference.blobs["h"].shape)
    h1, g1 = outputs_and_gradients(reference, x, cont, dh)
    h2, g2 = outputs_and_gradients(net, x, cont, dh)
    np.testing.assert_allclose(h2, h1, rtol=1e-12, atol=1e-13)
    assert g1.keys() == g2.keys()
    for name in g1:
        np.testing.assert_allclose(g2[name], g1[name], rtol=1e-10, atol=1e-12, err_msg=name)
