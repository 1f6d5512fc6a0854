"""A batch's inputs to the device in one transfer: one host buffer, viewed per input.

A host-to-device copy costs a launch and a wait for the bus whatever its size,
so a batch of ten small inputs (ids, cont, labels, positions) should cross
once: :func:`pack` lays them out back to back in one buffer of the net's dtype,
the buffer crosses, and :func:`unpack` gives each input its view of it.
:meth:`unroll.engine.net.Net.device_inputs` does all of it for a net.

>>> buffer, layout = pack({"a": np.arange(3), "b": np.ones((2, 2))}, np.float32)
>>> buffer.tolist(), layout
([0.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0], {'a': (0, (3,)), 'b': (3, (2, 2))})
>>> unpack(buffer, layout)["b"].shape
(2, 2)
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["pack", "unpack"]


def pack(arrays: dict, dtype) -> tuple[np.ndarray, dict]:
    """``arrays`` copied, in ``dtype``, into one flat host buffer: (buffer, layout), where
    the layout gives each name's (start, shape) for :func:`unpack`."""
    layout, start = {}, 0
    for name, array in arrays.items():
        array = np.asarray(array)
        layout[name] = (start, array.shape)
        start += array.size
    buffer = np.empty(start, dtype)
    for name, array in arrays.items():
        begin, shape = layout[name]
        buffer[begin : begin + math.prod(shape)] = np.asarray(array).reshape(-1)
    return buffer, layout


def unpack(buffer, layout: dict) -> dict:
    """Views of ``buffer`` (on the host or a device) as the arrays :func:`pack` laid out."""
    return {name: buffer[start : start + math.prod(shape)].reshape(shape)
            for name, (start, shape) in layout.items()}
