"""Input values checked on the host, before they go to the device.

Some layers need their bottom's values to be valid: Embed's ids must lie in
``[0, input_dim)``, the labels of SoftmaxWithLoss and Accuracy must be class
indices. Checking them on a device would make the host wait for it in every
forward (a sync, to read the verdict). Such a layer declares
``checks_host_bottoms = True`` and defines ``check_host_bottom(index, values, name)``
(both on :class:`unroll.layer.Layer`), which raises a NetError for bad
NumPy ``values`` of bottom ``index``; ``Net.set_input`` calls it on host
data, for every layer that reads the input (directly or through splits),
before the data is copied to the device.

>>> from unroll import Net
>>> net = Net('''
...   layer { name: "in" type: "Input" top: "ids" input_param { shape { dim: 3 } } }
...   layer { name: "e" type: "Embed" bottom: "ids" top: "v"
...           embed_param { num_output: 2 input_dim: 4 } }''')
>>> [(layer.name, k) for layer, k in input_readers(net._fwd, net.inputs)["ids"]]
[('e', 0)]
>>> net.forward(ids=np.array([0, 1, 7]))
Traceback (most recent call last):
unroll.errors.NetError: layer 'e' (Embed): bottom 'ids' holds 7.0 at index (2,); \
expected an integer in [0, 4)
"""

from __future__ import annotations

import numpy as np


def input_readers(schedule, inputs) -> dict[str, list]:
    """Input name -> the ``(layer, bottom index)`` pairs that check its host values.

    ``schedule`` is the net's forward schedule, ``(layer, bottoms, tops)`` in run
    order; a split's tops carry the value of its bottom, so their readers count,
    and a layer that writes into the input in place ends it: later readers see
    other values.
    """
    carries = {}  # id(blob) -> the input whose values it holds
    readers: dict[str, list] = {name: [] for name in inputs}
    for layer, bottoms, tops in schedule:
        if layer.type == "Input":
            carries.update((id(t), t.name) for t in tops if t.name in readers)
            continue
        for k, bottom in enumerate(bottoms):
            name = carries.get(id(bottom))
            if name is None:
                continue
            if layer.type == "Split":
                carries.update((id(t), name) for t in tops)
            elif layer.checks_host_bottoms:
                readers[name].append((layer, k))
        if layer.type != "Split":
            for top in tops:
                carries.pop(id(top), None)
    return readers


def check_host_input(readers, name: str, values: np.ndarray) -> None:
    """Run every reader's check of input ``name`` on its host ``values``."""
    for layer, k in readers.get(name, ()):
        layer.check_host_bottom(k, values, name)
