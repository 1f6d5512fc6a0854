"""Input values checked on the host, before they go to the device.

Some layers need their bottom's values to be valid: Embed's ids must lie in
``[0, input_dim)``, the labels of SoftmaxWithLoss and Accuracy must be class
indices. Checking them on a device would make the host wait for it in every
forward (a sync, to read the verdict). Such a layer declares
``checks_host_bottoms = True`` and defines ``check_host_bottom(index, values, name)``
(both on :class:`unroll.engine.layer.Layer`), which raises a NetError for bad
NumPy ``values`` of bottom ``index``; ``Net.set_input`` calls it on host
data, for every layer that reads the input (directly or through splits),
before the data is copied to the device.

Continuation indicators are checked the same way, by name rather than by
reader: an input named ``cont``, or starting with ``cont_`` or ending in
``_cont`` (the names the unroller, the built-in templates and Caffe's
examples give them) must hold only 0 (a sequence
starts at this step) and 1 (it continues). Its readers are often plain
Scale layers, which would take any value, so a 0.5 would blend two
sequences' states without an error.

>>> from unroll import Net
>>> net = Net('''
...   layer { name: "in" type: "Input" top: "ids" input_param { shape { dim: 3 } } }
...   layer { name: "e" type: "Embed" bottom: "ids" top: "v"
...           embed_param { num_output: 2 input_dim: 4 } }''')
>>> [(layer.name, k) for layer, k in input_readers(net._fwd, net.inputs)["ids"]]
[('e', 0)]
>>> net.forward(ids=np.array([0, 1, 7]))
Traceback (most recent call last):
unroll.core.errors.NetError: layer 'e' (Embed): bottom 'ids' holds 7.0 at index (2,); \
expected an integer in [0, 4)
"""

from __future__ import annotations

import functools

import numpy as np

from unroll.core.errors import NetError


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


def is_cont(name: str) -> bool:
    """Whether input ``name`` holds continuation indicators (``cont``, ``chars_cont``,
    Caffe's ``cont_sentence``).

    >>> is_cont("cont"), is_cont("chars_cont"), is_cont("cont_sentence"), is_cont("context")
    (True, True, True, False)
    """
    return name == "cont" or name.startswith("cont_") or name.endswith("_cont")


def check_cont(name: str, values: np.ndarray) -> None:
    """Raise a NetError unless the host ``values`` of input ``name`` are all 0 or 1.

    >>> check_cont("cont", np.array([[0.0, 1.0], [1.0, 0.5]]))
    Traceback (most recent call last):
    unroll.core.errors.NetError: input 'cont' holds 0.5 at index (1, 1); cont must be 0 (a \
sequence starts at this step) or 1 (it continues)
    """
    bad = (values != 0) & (values != 1)  # NaN is neither
    # count_nonzero, not bad.any(): every step of a decoder checks its cont, and .any()
    # pays a Python wrapper that costs more than a batch of 1's comparisons
    if np.count_nonzero(bad):
        x = values.reshape(-1)
        i = int(np.argmax(bad.reshape(-1)))
        at = tuple(int(k) for k in np.unravel_index(i, values.shape))
        raise NetError(f"input '{name}' holds {float(x[i])!r} at index {at}; cont must be 0 "
                       f"(a sequence starts at this step) or 1 (it continues)")


def host_checks_of(readers, name: str) -> list:
    """The checks of input ``name``'s host values, each a call on the values: the cont
    check where ``name`` is a cont, then every reader's. ``Net.set_input`` makes them once
    per net, so a run pays only for the checks themselves.

    >>> [check.func.__name__ for check in host_checks_of({}, "tgt_cont")]
    ['check_cont']
    >>> host_checks_of({}, "ids")
    []
    """
    checks = [functools.partial(check_cont, name)] if is_cont(name) else []
    checks += [functools.partial(_check_bottom, layer, k, name)
               for layer, k in readers.get(name, ())]
    return checks


def _check_bottom(layer, k: int, name: str, values: np.ndarray) -> None:
    layer.check_host_bottom(k, values, name)


def check_host_input(readers, name: str, values: np.ndarray) -> None:
    """Run every reader's check of input ``name`` on its host ``values``, and the cont check
    where ``name`` is a cont."""
    for check in host_checks_of(readers, name):
        check(values)
