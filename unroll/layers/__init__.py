"""Layer implementations, one module per family; importing registers them."""

from unroll.layers import (  # noqa: F401
    bias,
    data,
    eltwise,
    embed,
    inner_product,
    loss,
    neuron,
    normalization,
    recurrent_unit,
    sequence_end,
    shape,
    slice_concat,
)
