"""What ``unroll check`` runs: the battery of a step template, or of each layer of a net."""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np

from unroll.testing.layer_battery import check_layer
from unroll.testing.report import Report
from unroll.testing.template_battery import check_template

__all__ = ["check_net_layers", "import_reference", "run_battery"]


def import_reference(spec: str):
    """The function ``module:function`` names, imported from the Python path (and the current
    folder, as ``python -m`` would); ValueError naming what is missing."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name.isidentifier():
        raise ValueError(f"--reference {spec!r}: expected module:function, e.g. "
                         f"mycells:peephole_step")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ValueError(f"--reference {spec}: cannot import module '{module}': {e}") from None
    except AttributeError:
        raise ValueError(f"--reference {spec}: module '{module}' has no '{name}'") from None
    if not callable(found):
        raise ValueError(f"--reference {spec}: '{name}' is not a function")
    return found


def check_net_layers(net_param, reference=None, seed: int = 0) -> list[Report]:
    """:func:`check_layer` on each layer of a net but its Input layers, with bottoms of the
    shapes the net gives them, drawn uniformly from [-1, 1] (a layer that reads indices or
    labels needs its own inputs: call check_layer from Python). ``reference`` is for a net
    with a single such layer."""
    from unroll.engine.net import Net

    layers = [lp for lp in net_param.layer if lp.type != "Input"]
    if reference is not None and len(layers) != 1:
        raise ValueError(f"--reference is for a net of one layer (besides its Inputs); this one "
                         f"has {len(layers)}: {', '.join(lp.name for lp in layers)}")
    net = Net(net_param, dtype="float64", plan_memory=False)
    rng = np.random.default_rng(seed)
    reports = []
    for lp in layers:
        inputs = [rng.uniform(-1, 1, net.blobs[name].shape) for name in lp.bottom]
        reports.append(check_layer(lp, inputs, reference, seed=seed, strict=False))
    return reports


def run_battery(target: str, reference=None, variables=None, search_path=()) -> list[Report]:
    """The reports of ``unroll check TARGET``: a .prototxt net's layers, or a step template."""
    from unroll.core.proto import NetParameter, parse_text, read_prototxt

    if target.endswith(".prototxt"):
        if variables:
            raise ValueError(f"--set is for templates; {target} is a net prototxt")
        net_param = parse_text(read_prototxt(target), NetParameter(), target)
        return check_net_layers(net_param, reference)
    return [check_template(target, reference, search_path=search_path, strict=False,
                           **(variables or {}))]
