"""unroll: train recurrent nets by unrolling Caffe-style step templates.

>>> import unroll
>>> net = unroll.Net(unroll.expand("lstm", steps=5, batch=2, input_dim=3, hidden=4))
>>> net.forward()["h"].shape
(5, 2, 4)
"""

from unroll import layers  # noqa: F401  (registers the built-in layer types)
from unroll.blob import Blob
from unroll.bucketed_model import BucketedModel
from unroll.bucketing import BucketSampler
from unroll.errors import NetError, TemplateError
from unroll.layer import Layer, register_layer
from unroll.net import Net
from unroll.param_store import ParamStore
from unroll.proto import PrototxtError
from unroll.solver import Solver, SolverError
from unroll.unroller import carry_hidden, expand, to_prototxt

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
    "TemplateError",
    "carry_hidden",
    "expand",
    "register_layer",
    "to_prototxt",
]
__version__ = "0.1.0"
