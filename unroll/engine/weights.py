"""Weight I/O: a net's learned blobs as Caffe's binary .caffemodel, written and read back.

A .caffemodel is a NetParameter whose layers carry their blobs. Writing keeps only
the first layer to hold each param (its sharers' weights are that layer's, and real
Caffe skips absent layers when it loads), so the file does not grow with T. Reading
matches layers by name, as Caffe's ``CopyTrainedLayersFrom``, and refuses to leave a
learnable param without a value.

>>> from unroll import Net, expand
>>> import tempfile, pathlib
>>> net = Net(expand("rnn", steps=4, batch=2, input_dim=3, hidden=5))
>>> path = pathlib.Path(tempfile.mkdtemp()) / "rnn.caffemodel"
>>> net.save(path)
>>> [lp.name for lp in read_binary(path, NetParameter, ".caffemodel").layer]
['x_proj_seq', 'hh_t0']
>>> other = Net(expand("rnn", steps=9, batch=2, input_dim=3, hidden=5))
>>> other.copy_from(path)  # another T, the same params
"""

from __future__ import annotations

from pathlib import Path

from unroll.core.atomic import write_atomic
from unroll.core.errors import FileFormatError, NetError
from unroll.core.proto import (
    NetParameter,
    array_from_blob_proto,
    blob_proto_from_array,
    read_binary,
)
from unroll.engine.backend import to_numpy


def to_proto(name: str, layers, first_holders) -> NetParameter:
    """The learned blobs of ``layers`` as a NetParameter: a layer is written where it is
    the first to hold one of its params (``(layer name, blob index)`` in ``first_holders``)."""
    out = NetParameter(name=name)
    for layer in layers:
        if not any((layer.name, k) in first_holders for k in range(len(layer.blobs))):
            continue
        lp = out.layer.add()
        lp.CopyFrom(layer.param)
        del lp.blobs[:]
        for blob in layer.blobs:
            lp.blobs.add().CopyFrom(blob_proto_from_array(to_numpy(blob.data)))
    return out


def save(weights: NetParameter, path) -> None:
    """Write ``weights`` as a binary .caffemodel, atomically (temp file, then rename)."""
    write_atomic(path, weights.SerializeToString())


def copy_into(layers, learnable_params, xp, dtype, source, strict: bool = False,
              allow_missing: bool = False) -> None:
    """Load weights from a NetParameter or a .caffemodel path into ``layers``, by name.

    Source layers that the net lacks are skipped, as Caffe does, unless
    ``strict``; a blob count or shape mismatch is a NetError. Every learnable
    param must get a value, so that an empty or truncated file never leaves
    random weights in place; ``allow_missing`` permits a partial load
    (fine-tuning from a net with fewer layers). A file that does not decode is
    a FileFormatError naming it.
    """
    origin = "the weights"
    if not isinstance(source, NetParameter):
        path = Path(source)
        origin = str(path)
        source = read_binary(path, NetParameter, ".caffemodel")
        if not any(lp.blobs for lp in source.layer):
            raise FileFormatError(path, "holds no weights (an empty or truncated .caffemodel?)")
    by_name = {layer.name: layer for layer in layers}
    loaded: set[str] = set()
    for lp in source.layer:
        if not lp.blobs:
            continue
        layer = by_name.get(lp.name)
        if layer is None:
            if strict:
                raise NetError(f"{origin}: weights for layer '{lp.name}', which this net "
                               f"does not have")
            continue
        if len(lp.blobs) != len(layer.blobs):
            raise NetError(
                f"{origin}: layer '{lp.name}': the weights hold {len(lp.blobs)} blobs, the "
                f"layer has {len(layer.blobs)}"
            )
        for k, (bp, blob) in enumerate(zip(lp.blobs, layer.blobs)):
            try:
                value = array_from_blob_proto(bp)
            except ValueError as e:
                raise NetError(f"{origin}: layer '{lp.name}' blob {k}: {e}") from None
            if value.shape != blob.shape:
                raise NetError(
                    f"{origin}: layer '{lp.name}' blob {k}: the weights have shape "
                    f"{value.shape}, the layer has {blob.shape}"
                )
            blob.data[...] = xp.asarray(value, dtype)
            loaded.add(blob.name)
    missing = [p.name for p in learnable_params if p.blob.name not in loaded]
    if missing and not allow_missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise NetError(f"{origin}: no weights for {len(missing)} of the net's "
                       f"{len(learnable_params)} learnable params ({shown}); pass "
                       f"allow_missing=True to load only some")
