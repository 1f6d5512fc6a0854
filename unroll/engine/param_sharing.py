"""A net's learnable params, created or shared by name: Caffe's AppendParam.

``param { name: "W" }`` shares one weight between every layer that names it:
the first layer to hold it owns it (its blob lives in the :class:`ParamStore`),
the others get the owner's blob (or a view of it in their shape, under
``share_mode: PERMISSIVE``), so backward accumulates every holder's gradient
into one diff. A net builds its layers with a :class:`ParamMaker` as their
``make_param``.
"""

from __future__ import annotations

import numpy as np

from unroll.core.errors import NetError
from unroll.core.proto import ParamSpec, array_from_blob_proto
from unroll.engine.blob import Blob
from unroll.engine.fillers import fill
from unroll.engine.param_store import LearnableParam, ParamStore

__all__ = ["ParamMaker"]


class ParamMaker:
    """Creates, or shares by name, the params of one net's layers.

    ``fits(nbytes, culprit)`` is called before a new param's memory is taken
    (it raises where the net's memory limit is passed); ``shared_store`` says
    that the store is shared with other nets, so every learnable param must be
    named. ``learnable_params`` lists the params this net holds, once each;
    ``first_holders`` the ``(layer, index)`` first to hold each (as Caffe
    writes a .caffemodel).
    """

    def __init__(self, store: ParamStore, xp, dtype, host_rng, shared_store: bool, fits):
        self.store, self.xp, self.dtype = store, xp, dtype
        self.host_rng, self.shared_store, self.fits = host_rng, shared_store, fits
        self.learnable_params: list[LearnableParam] = []
        self.first_holders: set[tuple[str, int]] = set()

    def __call__(self, layer, index: int, shape: tuple, filler) -> Blob:
        """Param ``index`` of ``layer``, of ``shape``, filled by ``filler`` if it is new."""
        lp = layer.param
        spec = lp.param[index] if index < len(lp.param) else ParamSpec()
        learnable = layer.learnable
        lr_mult = spec.lr_mult if learnable else 0.0
        decay_mult = spec.decay_mult if learnable else 0.0
        if spec.name and spec.name in self.store:
            return self._share(layer, index, shape, spec, lr_mult, decay_mult)
        if not spec.name and self.shared_store and learnable:
            raise NetError(
                f"layer '{layer.name}' ({layer.type}): param {index} has no name; every param of "
                f"a net built over a shared parameter store must be named"
            )
        blob = Blob(shape, self.xp, self.dtype, spec.name or f"{layer.name}.{index}")
        self.fits(2 * blob.nbytes,  # its data and its diff
                  (f"param {index} ('{blob.name}')", shape, 2 * blob.nbytes,
                   f"layer '{layer.name}' ({layer.type})"))
        if index < len(lp.blobs):
            value = array_from_blob_proto(lp.blobs[index])
            if value.shape != tuple(shape):
                raise NetError(
                    f"layer '{layer.name}' ({layer.type}): blobs {index} in the prototxt has "
                    f"shape {value.shape}, the layer expects {tuple(shape)}"
                )
        else:
            value = fill(filler, shape, self.host_rng, self.dtype)
        blob.data[...] = self.xp.asarray(value, self.dtype)
        param = LearnableParam(
            blob.name, blob, lr_mult, decay_mult, layer.name,
            has_lr_mult=spec.HasField("lr_mult"), has_decay_mult=spec.HasField("decay_mult"),
        )
        self.store.add(param, named=bool(spec.name))
        self.learnable_params.append(param)
        self.first_holders.add((layer.name, index))
        return blob

    def _share(self, layer, index, shape, spec, lr_mult, decay_mult) -> Blob:
        owner = self.store[spec.name]
        where = (
            f"cannot share param '{spec.name}' owned by layer '{owner.owner}' with layer "
            f"'{layer.name}'"
        )
        if spec.share_mode == ParamSpec.PERMISSIVE:
            if owner.blob.count != int(np.prod(shape)):
                raise NetError(
                    f"{where}: count mismatch; owner param shape is {owner.blob.shape} "
                    f"({owner.blob.count}), sharing layer expects {shape} ({int(np.prod(shape))})"
                )
        elif owner.blob.shape != tuple(shape):
            raise NetError(
                f"{where}: shape mismatch; owner param shape is {owner.blob.shape}, sharing layer "
                f"expects {shape} (use share_mode: PERMISSIVE to share by count)"
            )
        for what, has, value in (
            ("lr_mult", spec.HasField("lr_mult"), lr_mult),
            ("decay_mult", spec.HasField("decay_mult"), decay_mult),
        ):
            if not has:
                continue
            if getattr(owner, f"has_{what}") and getattr(owner, what) != value:
                raise NetError(
                    f"{where}: {what} mismatch; owner has {getattr(owner, what)}, sharing layer "
                    f"has {value}"
                )
            setattr(owner, what, value)
            setattr(owner, f"has_{what}", True)
        if not any(p is owner for p in self.learnable_params):  # by identity: no field compare
            self.learnable_params.append(owner)
            self.first_holders.add((layer.name, index))
        if owner.blob.shape == tuple(shape):
            return owner.blob
        view = Blob((), self.xp, self.dtype, owner.blob.name)
        view.data = owner.blob.data.reshape(shape)
        view.diff = owner.blob.diff.reshape(shape)
        self.store.alias(view, owner)
        return view
