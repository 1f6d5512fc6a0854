"""Weight fillers with Caffe's names and semantics (FillerParameter).

Fillers draw on the host with NumPy and the result is moved to the device, so
a seed gives the same initial weights on every device.
"""

from __future__ import annotations

import numpy as np

from unroll.core.proto import FillerParameter

FILLERS = ("constant", "uniform", "gaussian", "xavier", "msra")


def _fans(shape) -> tuple[float, float]:
    # Caffe: fan_in = count / num, fan_out = count / channels
    count = int(np.prod(shape)) if shape else 1
    num = shape[0] if len(shape) >= 1 else 1
    channels = shape[1] if len(shape) >= 2 else 1
    return count / max(num, 1), count / max(channels, 1)


def _norm(filler: FillerParameter, shape) -> float:
    fan_in, fan_out = _fans(shape)
    if filler.variance_norm == FillerParameter.FAN_OUT:
        n = fan_out
    elif filler.variance_norm == FillerParameter.AVERAGE:
        n = (fan_in + fan_out) / 2.0
    else:
        n = fan_in
    return n or 1.0  # 0 only for an empty blob, which any scale fills alike


def fill(filler: FillerParameter | None, shape, rng: np.random.Generator, dtype) -> np.ndarray:
    """A NumPy array of ``shape`` filled as ``filler`` says (None: zeros).

    >>> f = FillerParameter(type="constant", value=0.5)
    >>> fill(f, (2,), np.random.default_rng(0), np.float32)
    array([0.5, 0.5], dtype=float32)
    """
    shape = tuple(shape)
    if filler is None:
        return np.zeros(shape, dtype)
    kind = filler.type
    if kind == "constant":
        out = np.full(shape, filler.value)
    elif kind == "uniform":
        out = rng.uniform(filler.min, filler.max, shape)
    elif kind == "gaussian":
        if filler.sparse >= 0:
            raise ValueError("gaussian filler: 'sparse' is not supported by unroll")
        out = rng.normal(filler.mean, filler.std, shape)
    elif kind == "xavier":
        scale = np.sqrt(3.0 / _norm(filler, shape))
        out = rng.uniform(-scale, scale, shape)
    elif kind == "msra":
        out = rng.normal(0.0, np.sqrt(2.0 / _norm(filler, shape)), shape)
    else:
        raise ValueError(f"unknown filler type {kind!r}; expected one of {FILLERS}")
    return out.astype(dtype)
