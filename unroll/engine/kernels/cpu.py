"""The recurrent units as single compiled passes on the CPU (numba), with the solver's
Adam rule and, on the host only, the parameter average (:func:`average_update`).

Every kernel takes the layer's arrays as they are (C-contiguous, any leading
axes), sees them as ``(rows, width)``, walks them once and computes in their
dtype (float32 or float64). Two choices keep the inner loops vectorized:

- ``error_model="numpy"``: no zero-division checks, whose branches would stop
  LLVM from vectorizing; ``fastmath={"contract"}``: a * b + c may become one fused
  multiply-add (a third fewer instructions, no less accurate; NaN and inf rules kept);
- our own :func:`tanh`: the C library's is scalar and, called per element,
  costs more than the dozen NumPy passes it replaces.

``cache=True`` keeps the compiled code on disk, so only the first run on a
machine pays the compile time; ``nogil=True`` lets threads running independent
branches overlap in the kernels, as they do in NumPy's GEMMs.
"""

from __future__ import annotations

from math import factorial

import numpy as np
from llvmlite import ir
from numba import njit
from numba.extending import intrinsic

LOG2E = 1.4426950408889634
# ln 2 = LN2_HI + LN2_LO; LN2_HI has 15 significant bits, so k * LN2_HI is exact for
# |k| < 2^9 even in float32 (Cody and Waite's argument reduction)
LN2_HI = 0.693145751953125
LN2_LO = 1.4286068203094172321e-06
# the Taylor series of (expm1(r) - r) / r^2 for |r| <= ln2 / 2: (1/n!, the largest relative
# share of its term in expm1(r)), n = 13..2; n = 14 would be below float64's epsilon
HALF_LN2 = 0.34657359027997264
TAYLOR = tuple((1.0 / factorial(n), HALF_LN2 ** (n - 1) / factorial(n)) for n in range(13, 1, -1))
# tanh(20) is 1 to float64 precision
TANH_SATURATES = 20.0

FAST = dict(error_model="numpy", fastmath={"contract"})
KERNEL = dict(cache=True, nogil=True, **FAST)
#: no "contract": a fused multiply-add rounds once where the array form it replaces rounds
#: twice, and that kernel promises the array form's bits
EXACT = dict(cache=True, nogil=True, error_model="numpy")


@intrinsic
def exp2(typingctx, k):
    """2^k for a float ``k`` holding an integer of the normal exponent range: the exponent
    bits written directly (an LLVM bitcast, which vectorizes, unlike a call to ldexp)."""

    def codegen(context, builder, signature, args):
        (value,) = args
        width, mantissa, bias = (32, 23, 127) if value.type == ir.FloatType() else (64, 52, 1023)
        integer = ir.IntType(width)
        exponent = builder.add(builder.fptosi(value, integer), ir.Constant(integer, bias))
        return builder.bitcast(builder.shl(exponent, ir.Constant(integer, mantissa)), value.type)

    return k(k), codegen


@njit(inline="always", **FAST)
def tanh(v, T):
    """tanh(v) in the precision of the float type ``T``, without branches or calls.

    tanh|v| = -m / (2 + m) with m = expm1(-2|v|), computed as 2^k expm1(r) + (2^k - 1)
    where -2|v| = k ln2 + r: no cancellation near 0, within 3 ulp everywhere, NaN stays NaN.
    """
    a = abs(v)
    a = T(TANH_SATURATES) if a > T(TANH_SATURATES) else a
    y = T(-2.0) * a
    k = np.floor(y * T(LOG2E) + T(0.5))
    r = (y - k * T(LN2_HI)) - k * T(LN2_LO)
    p, eps = T(0.0), np.finfo(T).eps
    for coefficient, share in TAYLOR:
        if share > eps / 4:  # a constant: float32 compiles 6 terms, float64 all 12
            p = p * r + T(coefficient)
    expm1_r = r + r * r * p
    scale = exp2(k if k >= T(-60.0) else T(-60.0))  # k in [-58, 0]; a NaN's k made harmless
    m = scale * expm1_r + (scale - T(1.0))
    t = -m / (T(2.0) + m)
    return -t if v < T(0.0) else t


@njit(inline="always", **FAST)
def sigmoid(v, T):
    """1 / (1 + exp(-v)) as 0.5 tanh(v / 2) + 0.5, the form the reference uses."""
    return T(0.5) * tanh(T(0.5) * v, T) + T(0.5)


@njit(inline="always")
def gates3(row, H):
    """The 3 gate views of a row of 3H entries: one stream each, which LLVM vectorizes
    where it gives up on several offsets into one array."""
    return row[:H], row[H:2 * H], row[2 * H:]


@njit(inline="always")
def gates4(row, H):
    """The 4 gate views of a row of 4H entries (see :func:`gates3`)."""
    return row[:H], row[H:2 * H], row[2 * H:3 * H], row[3 * H:]


# The gate expressions are written out in each kernel: behind an inlined helper
# taking the row views, numba's loops no longer vectorize (6-7x slower).


@njit(**KERNEL)
def lstm_unit_forward(c_prev, x, cont, c, h):
    """LSTMUnit forward. Nothing is saved: backward recomputes the gates from x, as fast
    as writing them out and reading them back, and without their memory."""
    T = c.dtype.type
    rows, H = cont.size, c.shape[-1]
    c_prev, c, h = c_prev.reshape((rows, H)), c.reshape((rows, H)), h.reshape((rows, H))
    x, cont = x.reshape((rows, 4 * H)), cont.reshape(rows)
    for m in range(rows):
        keep = cont[m]
        xi, xf, xo, xg = gates4(x[m], H)
        c_prev_m, c_m, h_m = c_prev[m], c[m], h[m]
        for j in range(H):
            i, f, o, g = sigmoid(xi[j], T), sigmoid(xf[j], T), sigmoid(xo[j], T), tanh(xg[j], T)
            c_new = f * c_prev_m[j] * keep + i * g
            c_m[j], h_m[j] = c_new, o * tanh(c_new, T)


# The backward loops take every output as an array and a loop-invariant flag, which
# LLVM hoists out of the loop: a None tested inside it (numba's Optional) stopped the
# loop vectorizing, and backward ran 1.7x slower. An output not propagated is stood in
# for by new memory, never written: an input passed again in its place made LLVM's
# no-alias check fail and the loop run 10x slower.


def lstm_unit_backward(c_prev, x, cont, dc, dh, dc_prev, dx):
    """LSTMUnit backward; ``dc_prev`` or ``dx`` may be None (not propagated)."""
    _lstm_unit_backward(c_prev, x, cont, dc, dh,
                        np.empty_like(dc) if dc_prev is None else dc_prev,
                        np.empty_like(x) if dx is None else dx,
                        dc_prev is not None, dx is not None)


@njit(**KERNEL)
def _lstm_unit_backward(c_prev, x, cont, dc, dh, dc_prev, dx, write_c_prev, write_x):
    T = dc.dtype.type
    one = T(1.0)
    rows, H = cont.size, dc.shape[-1]
    c_prev, dc, dh = c_prev.reshape((rows, H)), dc.reshape((rows, H)), dh.reshape((rows, H))
    x, cont = x.reshape((rows, 4 * H)), cont.reshape(rows)
    dc_prev, dx = dc_prev.reshape((rows, H)), dx.reshape((rows, 4 * H))
    for m in range(rows):
        keep = cont[m]
        xi, xf, xo, xg = gates4(x[m], H)
        dxi, dxf, dxo, dxg = gates4(dx[m], H)
        c_prev_m, dc_m, dh_m, dc_prev_m = c_prev[m], dc[m], dh[m], dc_prev[m]
        for j in range(H):
            i, f, o, g = sigmoid(xi[j], T), sigmoid(xf[j], T), sigmoid(xo[j], T), tanh(xg[j], T)
            t = tanh(f * c_prev_m[j] * keep + i * g, T)
            # all the gradient reaching c: from c itself and through h = o tanh(c)
            dc_total = dc_m[j] + dh_m[j] * o * (one - t * t)
            if write_c_prev:
                dc_prev_m[j] = dc_total * f * keep
            if write_x:
                dxi[j] = dc_total * g * i * (one - i)
                dxf[j] = dc_total * c_prev_m[j] * keep * f * (one - f)
                dxo[j] = dh_m[j] * t * o * (one - o)
                dxg[j] = dc_total * i * (one - g * g)


@njit(**KERNEL)
def gru_unit_forward(h_prev, x, hh, cont, h):
    """GRUUnit forward; nothing saved (see :func:`lstm_unit_forward`)."""
    T = h.dtype.type
    rows, H = cont.size, h.shape[-1]
    h_prev, h, cont = h_prev.reshape((rows, H)), h.reshape((rows, H)), cont.reshape(rows)
    x, hh = x.reshape((rows, 3 * H)), hh.reshape((rows, 3 * H))
    for m in range(rows):
        keep = cont[m]
        xr, xz, xn = gates3(x[m], H)
        hr, hz, hn = gates3(hh[m], H)
        h_prev_m, h_m = h_prev[m], h[m]
        for j in range(H):
            r, z = sigmoid(xr[j] + hr[j], T), sigmoid(xz[j] + hz[j], T)
            n = tanh(xn[j] + r * hn[j], T)
            h_m[j] = n + z * (h_prev_m[j] * keep - n)


def gru_unit_backward(h_prev, x, hh, cont, dh, dh_prev, dx, dhh):
    """GRUUnit backward; ``dh_prev``, ``dx`` or ``dhh`` may be None."""
    _gru_unit_backward(h_prev, x, hh, cont, dh,
                       np.empty_like(dh) if dh_prev is None else dh_prev,
                       np.empty_like(x) if dx is None else dx,
                       np.empty_like(hh) if dhh is None else dhh,
                       dh_prev is not None, dx is not None, dhh is not None)


@njit(**KERNEL)
def _gru_unit_backward(h_prev, x, hh, cont, dh, dh_prev, dx, dhh, write_h_prev, write_x,
                       write_hh):
    T = dh.dtype.type
    one = T(1.0)
    rows, H = cont.size, dh.shape[-1]
    h_prev, dh, cont = h_prev.reshape((rows, H)), dh.reshape((rows, H)), cont.reshape(rows)
    x, hh = x.reshape((rows, 3 * H)), hh.reshape((rows, 3 * H))
    dh_prev, dx, dhh = dh_prev.reshape((rows, H)), dx.reshape((rows, 3 * H)), dhh.reshape(
        (rows, 3 * H))
    for m in range(rows):
        keep = cont[m]
        xr, xz, xn = gates3(x[m], H)
        hr, hz, hn = gates3(hh[m], H)
        dxr, dxz, dxn = gates3(dx[m], H)
        dhr, dhz, dhn = gates3(dhh[m], H)
        h_prev_m, dh_m, dh_prev_m = h_prev[m], dh[m], dh_prev[m]
        for j in range(H):
            r, z = sigmoid(xr[j] + hr[j], T), sigmoid(xz[j] + hz[j], T)
            n = tanh(xn[j] + r * hn[j], T)
            d = dh_m[j]
            dn = d * (one - z) * (one - n * n)
            dz = d * (h_prev_m[j] * keep - n) * z * (one - z)
            dr = dn * hn[j] * r * (one - r)
            if write_h_prev:
                dh_prev_m[j] = d * z * keep
            if write_x:
                dxr[j], dxz[j], dxn[j] = dr, dz, dn
            if write_hh:
                dhr[j], dhz[j], dhn[j] = dr, dz, dn * r


def adam_update(diff, m, v, beta1, beta2, delta, step):
    """Caffe's Adam update value in one pass over C-contiguous arrays of any shape: the
    moments m and v move, and ``diff`` becomes ``step * m / (sqrt(v) + delta)``, where
    ``step`` is one number or an array with one per entry (mixed lr_mult)."""
    T = diff.dtype.type
    per_entry = np.ndim(step) > 0
    rates = step.reshape(-1) if per_entry else np.full(1, step, diff.dtype)
    _adam(diff.reshape(-1), m.reshape(-1), v.reshape(-1), T(beta1), T(beta2), T(delta), rates,
          per_entry)


@njit(**KERNEL)
def _adam(g, m, v, b1, b2, eps, rates, per_entry):
    one = g.dtype.type(1.0)
    for k in range(g.size):
        mk = b1 * m[k] + (one - b1) * g[k]
        vk = b2 * v[k] + (one - b2) * (g[k] * g[k])
        m[k], v[k] = mk, vk
        # loop-invariant: LLVM takes the test out of the loop, which still vectorizes
        g[k] = (rates[k] if per_entry else rates[0]) * mk / (np.sqrt(vk) + eps)


def average_update(avg, value, rate):
    """Polyak averaging's ``avg += rate * (value - avg)`` in one pass over C-contiguous
    arrays of one shape, rounded as the three array passes it replaces (a difference, a
    product, a sum, each in the arrays' dtype), so bit for bit the same average.

    >>> avg, value = np.zeros(3, np.float32), np.ones(3, np.float32)
    >>> average_update(avg, value, 0.25)
    >>> avg
    array([0.25, 0.25, 0.25], dtype=float32)
    """
    _average(avg.reshape(-1), value.reshape(-1), avg.dtype.type(rate))


@njit(**EXACT)
def _average(avg, value, rate):
    for k in range(avg.size):
        avg[k] = avg[k] + (value[k] - avg[k]) * rate
