"""unroll: train recurrent nets by unrolling Caffe-style step templates.

>>> import unroll
>>> net = unroll.Net('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 } } }')
>>> net.forward()["x"].shape
(2,)
"""

from unroll import layers  # noqa: F401  (registers the built-in layer types)
from unroll.blob import Blob
from unroll.errors import NetError, TemplateError
from unroll.layer import Layer, register_layer

__all__ = ["Blob", "Layer", "NetError", "TemplateError", "register_layer"]
__version__ = "0.1.0"
