"""The per-entry gradient checkers: central differences of every entry, in float64."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unroll.core.proto import LayerParameter, parse_text
from unroll.engine.backend import make_rng, to_numpy
from unroll.engine.blob import Blob
from unroll.engine.layer import Layer, layer_class

__all__ = ["GradientMismatch", "check_layer_gradient", "check_net_gradient", "numeric_gradient",
           "run_layer"]

FLOAT = np.float64


# -- gradient checking ------------------------------------------------------


class GradientMismatch(AssertionError):
    """An analytic gradient that disagrees with finite differences."""


def _compare(what: str, analytic, numeric, rtol: float, atol: float) -> None:
    analytic, numeric = np.asarray(analytic, FLOAT), np.asarray(numeric, FLOAT)
    bad = ~np.isclose(analytic, numeric, rtol=rtol, atol=atol)
    if bad.any():
        i = np.unravel_index(np.argmax(np.abs(analytic - numeric) * bad), analytic.shape)
        raise GradientMismatch(
            f"{what}: {int(bad.sum())} of {bad.size} gradient entries differ from finite "
            f"differences; worst at index {tuple(int(k) for k in i)}: "
            f"analytic {analytic[i]:.8g}, numeric {numeric[i]:.8g}"
        )


def numeric_gradient(f, array, eps: float = 1e-6) -> np.ndarray:
    """Central differences of scalar ``f()`` w.r.t. every entry of ``array`` (changed in place)."""
    grad = np.zeros(array.shape, FLOAT)
    flat = array.reshape(-1)
    g = grad.reshape(-1)
    for i in range(flat.size):
        old = float(flat[i])
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        g[i] = (up - down) / (2 * eps)
    return grad


def _layer_param(spec) -> LayerParameter:
    if isinstance(spec, LayerParameter):
        return spec
    return parse_text(spec, LayerParameter(), "<layer spec>")


def run_layer(spec, bottoms: Sequence, xp=np, phase: str = "train", *, n_tops: int = 1,
              in_place: bool = False, dtype=FLOAT, seed: int = 0):
    """Build, set up, reshape and forward one layer on ``bottoms``; float64 by default.

    Returns ``(layer, bottom blobs, top blobs)``; with ``in_place`` the top is
    bottom 0's own blob, as a net runs an in-place layer.

    >>> layer, _, (top,) = run_layer('type: "ReLU"', [np.array([-1.0, 2.0])])
    >>> top.data.tolist()
    [0.0, 2.0]
    """
    param = _layer_param(spec)
    layer = layer_class(param)(param, xp=xp, dtype=dtype, phase=phase, rng=make_rng(xp, seed))
    blobs = []
    for i, value in enumerate(bottoms):
        blob = Blob(np.shape(value), xp, dtype, f"bottom{i}")
        blob.data[...] = xp.asarray(value, dtype)
        blobs.append(blob)
    tops = [blobs[0]] if in_place else [Blob((), xp, dtype, f"top{i}") for i in range(n_tops)]
    layer.set_up(blobs, tops)
    layer.forward(blobs, tops)
    return layer, blobs, tops


def check_layer_gradient(
    spec,
    bottoms: Sequence,
    *,
    check: Sequence[int] | None = None,
    params: bool = True,
    phase: str = "train",
    seed: int = 0,
    eps: float = 1e-6,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    xp=np,
) -> Layer:
    """Check a layer's backward against central finite differences, in float64.

    ``spec`` is a LayerParameter or its prototxt text; ``bottoms`` the bottom
    values. The objective is ``sum_i <top_i, w_i>`` with fixed random weights
    ``w_i``; its gradient w.r.t. the bottoms listed in ``check`` (default:
    every bottom the layer allows gradients for) and, with ``params``, w.r.t.
    every learnable blob, is compared with finite differences. Random layers
    (Dropout) are re-seeded before each forward so that one mask is used.
    Raises :class:`GradientMismatch` naming the blob and worst entry; returns
    the layer.

    >>> check_layer_gradient('type: "TanH"', [np.linspace(-1, 1, 6).reshape(2, 3)])
    <TanHLayer 'TanH'>
    """
    param = _layer_param(spec)
    n_tops = len(param.top) or max(1, layer_class(param).num_tops[0])
    layer, bottom_blobs, tops = run_layer(param, bottoms, xp, phase, n_tops=n_tops, seed=seed)
    if check is None:
        check = [i for i in range(len(bottom_blobs)) if layer.allow_force_backward(i)]

    def forward() -> float:
        layer.rng = make_rng(xp, seed)
        layer.forward(bottom_blobs, tops)
        return float(sum((to_numpy(t.data) * w).sum() for t, w in zip(tops, weights)))

    wrng = np.random.default_rng(seed + 1)
    weights = [wrng.uniform(-1, 1, t.shape) for t in tops]
    for b in layer.blobs:
        b.diff[...] = 0
    forward()
    for t, w in zip(tops, weights):
        t.diff[...] = xp.asarray(w)
    propagate = [i in check for i in range(len(bottom_blobs))]
    layer.backward(tops, propagate, bottom_blobs)
    analytic_bottoms = {i: to_numpy(bottom_blobs[i].diff).copy() for i in check}
    analytic_params = [to_numpy(b.diff).copy() for b in layer.blobs]

    for i in check:
        host = to_numpy(bottom_blobs[i].data).astype(FLOAT)

        def f(i=i, host=host):
            bottom_blobs[i].data[...] = xp.asarray(host)
            return forward()

        numeric = numeric_gradient(f, host, eps)
        bottom_blobs[i].data[...] = xp.asarray(host)
        _compare(f"layer '{layer.name}' ({layer.type}) bottom {i}", analytic_bottoms[i],
                 numeric, rtol, atol)
    if params:
        for k, blob in enumerate(layer.blobs):
            host = to_numpy(blob.data).astype(FLOAT)

            def g(blob=blob, host=host):
                blob.data[...] = xp.asarray(host)
                return forward()

            numeric = numeric_gradient(g, host, eps)
            blob.data[...] = xp.asarray(host)
            _compare(f"layer '{layer.name}' ({layer.type}) param {k}", analytic_params[k],
                     numeric, rtol, atol)
    return layer


def check_net_gradient(
    net,
    wrt: Sequence[str] = (),
    *,
    params: bool = True,
    eps: float = 1e-6,
    rtol: float = 1e-4,
    atol: float = 1e-6,
) -> None:
    """Check a whole net's backward against finite differences of its loss.

    ``net`` must be built with ``dtype="float64"`` and have its inputs filled.
    Checks the gradient of ``net.loss`` w.r.t. the input blobs named in
    ``wrt`` and, with ``params``, w.r.t. every learnable (owner) param, so a
    shared weight is checked once, with every timestep's contribution summed.
    """
    if np.dtype(net.dtype) != FLOAT:
        raise ValueError(f"check_net_gradient needs a float64 net, found {net.dtype}")
    if wrt and not net.net_param.force_backward:
        # Caffe's rule: nothing propagates into an Input's tops unless the net forces it,
        # so every analytic input gradient would read 0
        raise ValueError(
            f"check_net_gradient(wrt={list(wrt)}): the net computes no gradient for its inputs "
            f"unless it is built with force_backward: true (net_param.force_backward = True)"
        )
    xp = net.xp

    def loss() -> float:
        net.forward()
        return float(net.loss)

    loss()
    net.clear_param_diffs()
    net.backward()
    # "x@0": the input itself, even where an in-place layer on it writes a later version
    blobs = {name: net.blobs[f"{name}@0"] for name in wrt}
    analytic = {name: to_numpy(blobs[name].diff).copy() for name in wrt}
    learnable = net.learnable_params if params else []
    analytic_params = [to_numpy(p.blob.diff).copy() for p in learnable]

    for name, blob in blobs.items():
        host = to_numpy(blob.data).astype(FLOAT)

        def f(blob=blob, host=host):
            blob.data[...] = xp.asarray(host)
            return loss()

        numeric = numeric_gradient(f, host, eps)
        blob.data[...] = xp.asarray(host)
        _compare(f"net input '{name}'", analytic[name], numeric, rtol, atol)
    for p, a in zip(learnable, analytic_params):
        host = to_numpy(p.blob.data).astype(FLOAT)

        def g(p=p, host=host):
            p.blob.data[...] = xp.asarray(host)
            return loss()

        numeric = numeric_gradient(g, host, eps)
        p.blob.data[...] = xp.asarray(host)
        _compare(f"param '{p.name}'", a, numeric, rtol, atol)
    loss()
