"""Fused kernels for the recurrent units and Adam: numba on the CPU, CuPy on the GPU.

A recurrent unit (LSTMUnit, GRUUnit) is a dozen element-wise operations per
step. Written against ``xp`` they make a dozen passes over memory; a fused
kernel makes one. Each unit keeps its ``xp`` code as the reference, and the
tests hold the fused kernels to it.

Which path a unit takes is its ``engine``: "fused" (the default) or
"reference". ``UNROLL_ENGINE=reference`` in the environment makes every unit
built afterwards use the reference; a layer's ``engine`` attribute switches one
unit. Both modules below expose the same functions, on arrays of one dtype:
the layer's C-contiguous blobs (any leading axes) and its saved ``(rows,
width)`` arrays: ``lstm_unit_forward``, ``lstm_unit_backward``,
``gru_unit_forward``, ``gru_unit_backward``; and ``adam_update``, the solver's
Adam rule in one pass instead of eleven (the same switch selects it).

>>> import numpy as np
>>> fused_kernels(np).__name__
'unroll.engine.kernels.cpu'
"""

from __future__ import annotations

import importlib
import os

from unroll.engine.backend import device_of

KERNEL_MODULES = {"cpu": "unroll.engine.kernels.cpu", "gpu": "unroll.engine.kernels.gpu"}
KERNELS = ("lstm_unit_forward", "lstm_unit_backward", "gru_unit_forward", "gru_unit_backward",
           "adam_update")
ENGINES = ("fused", "reference")
ENGINE_VARIABLE = "UNROLL_ENGINE"


def default_engine() -> str:
    """The engine a new unit takes: ``$UNROLL_ENGINE``, else "fused"."""
    name = os.environ.get(ENGINE_VARIABLE, "") or "fused"
    if name not in ENGINES:
        raise ValueError(f"{ENGINE_VARIABLE}={name!r}: expected one of {', '.join(ENGINES)}")
    return name


def fused_kernels(xp):
    """The kernel module for the device of ``xp`` (None for an array module with no
    kernels: its units run the reference), imported on first use, so that numba's start-up
    time is paid by nets with recurrent units only. The trace device runs the CPU's kernels,
    each call counted as the one launch the GPU's would be."""
    if device_of(xp) == "trace":
        from unroll.engine import trace

        return trace.twin(importlib.import_module(KERNEL_MODULES["cpu"]), KERNELS)
    module = KERNEL_MODULES.get(device_of(xp))
    return None if module is None else importlib.import_module(module)
