"""The array-module switch: NumPy on the CPU, CuPy on the GPU, the counting trace module.

This is the only module that imports CuPy. Everything else receives ``xp``
(the array module) from here and writes one code path against it.
``device="trace"`` is :mod:`unroll.engine.trace`: NumPy underneath, counting the
kernel launches, host syncs and transfers a GPU would make.

>>> xp = get_array_module("cpu")
>>> xp.__name__
'numpy'
"""

from __future__ import annotations

import numpy as np

from unroll.engine import trace

__all__ = ["DEVICES", "device_of", "get_array_module", "make_rng", "module_of", "nccl_module",
           "to_numpy"]

try:
    import cupy as _cupy

    try:
        GPU_AVAILABLE = _cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # a CuPy without a driver or device: behave as if absent
        GPU_AVAILABLE = False
except ImportError:
    _cupy = None
    GPU_AVAILABLE = False

DEVICES = ("cpu", "gpu", "trace")


def get_array_module(device: str = "cpu"):
    """The array module for ``device``: ``numpy`` ("cpu"), ``cupy`` ("gpu") or
    :mod:`unroll.engine.trace` ("trace")."""
    if device == "cpu":
        return np
    if device == "trace":
        return trace
    if device == "gpu":
        if not GPU_AVAILABLE:
            raise RuntimeError(
                'device="gpu" needs CuPy and a CUDA device; install unroll[gpu] on a GPU machine'
            )
        return _cupy
    raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")


def nccl_module():
    """CuPy's NCCL bindings (``cupy.cuda.nccl``): unroll.train.distributed's GPU collectives."""
    get_array_module("gpu")
    from cupy.cuda import nccl

    if not nccl.available:
        raise RuntimeError("this CuPy has no NCCL; install NCCL for its CUDA version")
    return nccl


def device_of(xp) -> str:
    """"cpu", "gpu" or "trace" for an array module."""
    if xp is np:
        return "cpu"
    return "trace" if xp is trace else "gpu"


def module_of(array):
    """The array module (numpy, cupy or unroll.engine.trace) that ``array`` belongs to."""
    if isinstance(array, np.ndarray):
        return np
    return trace if isinstance(array, trace.ndarray) else _cupy


def to_numpy(array) -> np.ndarray:
    """A NumPy copy (or view, on the CPU) of a NumPy, CuPy or trace array."""
    if isinstance(array, np.ndarray):
        return array
    return array.get()


def make_rng(xp, seed):
    """A random generator on the device of ``xp`` (dropout masks and the like)."""
    if xp is np:
        return np.random.default_rng(seed)
    return xp.random.default_rng(seed)
