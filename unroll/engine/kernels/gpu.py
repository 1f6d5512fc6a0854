"""The recurrent units as single CUDA kernels (CuPy ElementwiseKernel), one thread per
entry (m, j) of the state, seen as ``(rows, H)``.

The kernels are compiled on first use, through the CuPy that ``unroll.engine.backend``
imports, and their arguments are those of ``unroll.engine.kernels.cpu``: each is
checked against the unit's ``xp`` reference on a GPU.
"""

from __future__ import annotations

from functools import cache

from unroll.engine.backend import get_array_module

PREAMBLE = r"""
template <typename T> __device__ T unroll_sigmoid(T v) {
    return T(0.5) * tanh(T(0.5) * v) + T(0.5);
}
"""

# the gates of entry (m, j) from the projections: g0 is the flat index of gate 0's column j
LSTM_GATES = r"""
const ptrdiff_t m = i / H, j = i % H, g0 = m * 4 * H + j;
const T gi = unroll_sigmoid(x[g0]), gf = unroll_sigmoid(x[g0 + H]);
const T go = unroll_sigmoid(x[g0 + 2 * H]), gg = tanh(x[g0 + 3 * H]);
const T keep = cont[m];
const T c_new = gf * c_prev[i] * keep + gi * gg;
"""
GRU_GATES = r"""
const ptrdiff_t m = i / H, j = i % H, g0 = m * 3 * H + j;
const T r = unroll_sigmoid(x[g0] + hh[g0]);
const T z = unroll_sigmoid(x[g0 + H] + hh[g0 + H]);
const T cand = tanh(x[g0 + 2 * H] + r * hh[g0 + 2 * H]);  // n: a reserved name
const T keep = cont[m];
"""

# name: (input parameters, output parameters, body); ``i`` is the flat index of (m, j).
# As on the CPU, nothing is saved: backward recomputes the gates.
SOURCES = {
    "lstm_unit_forward": (
        "raw T c_prev, raw T x, raw T cont, int64 H",
        "raw T c, raw T h",
        LSTM_GATES + r"""
        c[i] = c_new;
        h[i] = go * tanh(c_new);
        """,
    ),
    "lstm_unit_backward": (
        "raw T c_prev, raw T x, raw T cont, raw T dc, raw T dh, "
        "bool want_dc_prev, bool want_dx, int64 H",
        "raw T dc_prev, raw T dx",
        LSTM_GATES + r"""
        const T t = tanh(c_new);
        const T dc_total = dc[i] + dh[i] * go * (T(1) - t * t);
        if (want_dc_prev) dc_prev[i] = dc_total * gf * keep;
        if (want_dx) {
            dx[g0] = dc_total * gg * gi * (T(1) - gi);
            dx[g0 + H] = dc_total * c_prev[i] * keep * gf * (T(1) - gf);
            dx[g0 + 2 * H] = dh[i] * t * go * (T(1) - go);
            dx[g0 + 3 * H] = dc_total * gi * (T(1) - gg * gg);
        }
        """,
    ),
    "gru_unit_forward": (
        "raw T h_prev, raw T x, raw T hh, raw T cont, int64 H",
        "raw T h",
        GRU_GATES + r"""
        h[i] = cand + z * (h_prev[i] * keep - cand);
        """,
    ),
    "gru_unit_backward": (
        "raw T h_prev, raw T x, raw T hh, raw T cont, raw T dh, "
        "bool want_dh_prev, bool want_dx, bool want_dhh, int64 H",
        "raw T dh_prev, raw T dx, raw T dhh",
        GRU_GATES + r"""
        const T d = dh[i];
        const T dn = d * (T(1) - z) * (T(1) - cand * cand);
        const T dz = d * (h_prev[i] * keep - cand) * z * (T(1) - z);
        const T dr = dn * hh[g0 + 2 * H] * r * (T(1) - r);
        if (want_dh_prev) dh_prev[i] = d * z * keep;
        if (want_dx) { dx[g0] = dr; dx[g0 + H] = dz; dx[g0 + 2 * H] = dn; }
        if (want_dhh) { dhh[g0] = dr; dhh[g0 + H] = dz; dhh[g0 + 2 * H] = dn * r; }
        """,
    ),
    "adam_update": (
        "float64 beta1, float64 beta2, float64 delta, T step",
        "T diff, T m, T v",
        r"""
        const T g = diff;
        m = T(beta1) * m + (T(1) - T(beta1)) * g;
        v = T(beta2) * v + (T(1) - T(beta2)) * (g * g);
        diff = T(step) * m / (sqrt(v) + T(delta));
        """,
    ),
}


@cache
def kernel(name: str):
    """The compiled ElementwiseKernel ``name`` of :data:`SOURCES`."""
    inputs, outputs, body = SOURCES[name]
    cupy = get_array_module("gpu")
    return cupy.ElementwiseKernel(inputs, outputs, body, f"unroll_{name}", preamble=PREAMBLE)


def flat(arrays):
    """1-D views of C-contiguous arrays: the kernels index them by flat position."""
    return [a.reshape(-1) for a in arrays]


def optional(diffs, like):
    """(wanted flags, 1-D arrays): an unwanted diff (None) becomes an empty array of
    ``like``'s dtype, never written, since a kernel's parameters must all be arrays."""
    empty = get_array_module("gpu").empty(0, like.dtype)
    return [d is not None for d in diffs], flat(empty if d is None else d for d in diffs)


def lstm_unit_forward(c_prev, x, cont, c, h):
    kernel("lstm_unit_forward")(*flat((c_prev, x, cont)), c.shape[-1], *flat((c, h)),
                                size=c.size)


def lstm_unit_backward(c_prev, x, cont, dc, dh, dc_prev, dx):
    wanted, outputs = optional((dc_prev, dx), dc)
    kernel("lstm_unit_backward")(*flat((c_prev, x, cont, dc, dh)), *wanted, dc.shape[-1],
                                 *outputs, size=dc.size)


def gru_unit_forward(h_prev, x, hh, cont, h):
    kernel("gru_unit_forward")(*flat((h_prev, x, hh, cont)), h.shape[-1], *flat((h,)),
                               size=h.size)


def gru_unit_backward(h_prev, x, hh, cont, dh, dh_prev, dx, dhh):
    wanted, outputs = optional((dh_prev, dx, dhh), dh)
    kernel("gru_unit_backward")(*flat((h_prev, x, hh, cont, dh)), *wanted, dh.shape[-1],
                                *outputs, size=dh.size)


def adam_update(diff, m, v, beta1, beta2, delta, step):
    # step: one number, or one per entry (mixed lr_mult)
    if getattr(step, "ndim", 0):
        step = step.reshape(diff.shape)
    else:
        step = diff.dtype.type(step)  # a kernel argument, not a transfer
    kernel("adam_update")(float(beta1), float(beta2), float(delta), step, diff, m, v)
