"""Truncated BPTT: a running net's final states carried into its next chunk's initial ones.

A net expanded with ``expose_hidden=True`` takes every state as an input ``X_0``
and gives it back as an output ``X_T`` (docs/design.md, 3. Unrolling); between
the chunks of a long stream, :func:`carry_hidden` copies each ``X_T`` into
``X_0``, so the next chunk carries on where this one stopped.

>>> import unroll, numpy as np
>>> net = unroll.Net(unroll.expand("rnn", steps=2, batch=1, input_dim=1, hidden=2,
...                                expose_hidden=True))
>>> _ = net.forward(x=np.ones((2, 1, 1)), cont=np.ones((2, 1)))
>>> sorted(carry_hidden(net))
['h_0']
"""

from __future__ import annotations

__all__ = ["carry_hidden"]


def carry_hidden(model) -> dict:
    """Copy each exposed final state ``X_T`` into its initial state ``X_0`` (truncated BPTT).

    ``model`` is a :class:`~unroll.engine.net.Net` or a
    :class:`~unroll.train.bucketed_model.BucketedModel` (the net that ran last
    gives the states; every net the model has built receives them). Returns
    {initial name: state}; pass it to the next ``forward`` of a bucketed
    model whose next chunk length has no net yet. Use between the chunks of
    long streams, on a net expanded with ``expose_hidden=True``, with cont
    from ``cont_from_lengths(..., continues=True)`` so the chunk carries on.
    """
    nets = getattr(model, "nets", None)
    source = model.active if nets is not None else model
    if source is None:
        raise ValueError("carry_hidden: the model has not run forward yet")
    state = {}
    for name in source.outputs:
        initial = f"{name[:-2]}_0"
        if name.endswith("_T") and initial in source.inputs:
            state[initial] = source.blobs[name].data.copy()
    if not state:
        raise ValueError(
            "carry_hidden: the net exposes no final states (no output X_T with an input X_0); "
            "expand it with expose_hidden=True"
        )
    for net in nets.values() if nets is not None else [model]:
        for initial, value in state.items():
            if initial in net.inputs:
                net.set_input(initial, value)
    return state
