"""What ``unroll check`` runs: the battery of a step template, or of each layer of a net."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys

import numpy as np

from unroll.testing.layer_battery import check_layer
from unroll.testing.report import Report, describe
from unroll.testing.template_battery import check_template

__all__ = ["BATTERY_OPTIONS", "ReferenceExited", "check_net_layers", "import_reference",
           "run_battery"]

#: what ``unroll check --set`` takes besides a template's variables (the sizes bounded by
#: :data:`~unroll.testing.template_battery.LIMITS`, and the seed)
BATTERY_OPTIONS = ("steps", "batch", "input_dim", "directions", "seed")


class ReferenceExited(Exception):
    """A reference called sys.exit: the check it ran in fails; ``unroll check`` goes on."""


def _no_exit(function, spec: str):
    """``function``, with a sys.exit inside it raised as :class:`ReferenceExited`: an exit
    would end ``unroll check`` with the reference's status and no table."""

    @functools.wraps(function)
    def reference(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except SystemExit as e:  # its traceback kept: the line that called sys.exit
            raise ReferenceExited(f"the reference {spec} called sys.exit({e.code!r})"
                                  ).with_traceback(e.__traceback__) from None

    return reference


def import_reference(spec: str):
    """The function ``module:function`` names, imported from the Python path (and the current
    folder, as ``python -m`` would); ValueError naming what is missing or wrong.

    The module is a dotted name of an importable module (no path, no relative
    import); a sys.exit inside the function raises :class:`ReferenceExited`.

    >>> float(import_reference("numpy:tanh")(0.0))
    0.0
    >>> import_reference("../../etc/passwd:x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --reference '../../etc/passwd:x': expected a module's dotted name, found '../...
    """
    module, sep, name = spec.partition(":")
    if not sep or not module or not name.isidentifier():
        raise ValueError(f"--reference {spec!r}: expected module:function, e.g. "
                         f"mycells:peephole_step")
    if not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"--reference {spec!r}: expected a module's dotted name, found "
                         f"{module!r} (a module on the Python path or in this folder, like "
                         f"mycells or mypackage.cells)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ValueError(f"--reference {spec}: cannot import module '{module}': {e}") from None
    except AttributeError:
        raise ValueError(f"--reference {spec}: module '{module}' has no '{name}'") from None
    except SystemExit as e:
        raise ValueError(f"--reference {spec}: importing module '{module}' called "
                         f"sys.exit({e.code!r})") from None
    except Exception as e:  # the module's own code failed as it was imported
        raise ValueError(f"--reference {spec}: importing module '{module}' raised "
                         f"{describe(e)}") from None
    if not callable(found):
        raise ValueError(f"--reference {spec}: '{name}' is not a function")
    return _no_exit(found, spec)


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


def _battery_options(variables: dict) -> dict:
    """Refuse a ``--set`` key that is a keyword of check_template but not a battery option
    (``strict``, ``devices``: the command sets those)."""
    keywords = set(inspect.signature(check_template).parameters) - {"template",
                                                                      "reference_step"}
    for key in variables:
        if key in keywords and key not in BATTERY_OPTIONS:
            raise ValueError(f"--set {key}: not a template variable, and not one of the "
                             f"battery options --set takes ({', '.join(BATTERY_OPTIONS)})")
    return variables


def run_battery(target: str, reference=None, variables=None, search_path=()) -> list[Report]:
    """The reports of ``unroll check TARGET``: a .prototxt net's layers, or a step template.

    ``variables`` are the template's and the battery's options
    (:data:`BATTERY_OPTIONS`), each size bounded by
    :data:`~unroll.testing.template_battery.LIMITS`.
    """
    from unroll.core.proto import NetParameter, parse_text, read_prototxt

    if target.endswith(".prototxt"):
        if variables:
            raise ValueError(f"--set is for templates; {target} is a net prototxt")
        net_param = parse_text(read_prototxt(target), NetParameter(), target)
        return check_net_layers(net_param, reference)
    return [check_template(target, reference, search_path=search_path, strict=False,
                           **_battery_options(variables or {}))]
