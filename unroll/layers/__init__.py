"""Layer implementations, one module per family; importing registers them."""

from unroll.layers import (  # noqa: F401
    caffe_recurrent,
    data,
    eltwise,
    embed,
    inner_product,
    loss,
    neuron,
    normalization,
    recurrent_unit,
    shape,
    slice_concat,
)
