"""unroll: train recurrent nets by unrolling Caffe-style step templates.

>>> import unroll
>>> net = unroll.Net(unroll.expand("lstm", steps=5, batch=2, input_dim=3, hidden=4))
>>> net.forward()["h"].shape
(5, 2, 4)
"""

import importlib

# blas_spin before anything here loads NumPy: OpenBLAS reads its spin timeout only then
from unroll import _moved
from unroll.core import blas_spin  # noqa: F401

_moved.install()  # the module paths of the flat layout still import, with a warning

# what ``import unroll`` offers, imported on first use: the sampler alone
# (unroll.train.bucketing) then needs neither protobuf nor the layers
_EXPORTS = {
    "Blob": "unroll.engine.blob",
    "BucketSampler": "unroll.train.bucketing",
    "BucketedModel": "unroll.train.bucketed_model",
    "Layer": "unroll.engine.layer",
    "Net": "unroll.engine.net",
    "NetError": "unroll.core.errors",
    "ParamStore": "unroll.engine.param_store",
    "PrototxtError": "unroll.core.proto",
    "Solver": "unroll.train.solver",
    "SolverError": "unroll.train.solver",
    "Stepper": "unroll.train.stepper",
    "TemplateError": "unroll.core.errors",
    "Trainer": "unroll.train.trainer",
    "carry_hidden": "unroll.train.carry",
    "expand": "unroll.frontend.unroller",
    "register_layer": "unroll.engine.layer",
    "to_prototxt": "unroll.frontend.unroller",
}

#: the exports that build nets: they bring the frontend, which registers its unroller with
#: the engine (see unroll.engine.hidden_nets)
_BUILD_NETS = {"unroll.engine.net", "unroll.train.bucketed_model", "unroll.train.solver",
               "unroll.train.stepper", "unroll.train.trainer"}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'unroll' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if module in _BUILD_NETS:  # Caffe's LSTM/RNN layers unroll with the frontend's expand
        importlib.import_module("unroll.frontend.unroller")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "Blob",
    "BucketSampler",
    "BucketedModel",
    "Layer",
    "Net",
    "NetError",
    "ParamStore",
    "PrototxtError",
    "Solver",
    "SolverError",
    "Stepper",
    "TemplateError",
    "Trainer",
    "carry_hidden",
    "expand",
    "register_layer",
    "to_prototxt",
]
__version__ = "0.1.0"
