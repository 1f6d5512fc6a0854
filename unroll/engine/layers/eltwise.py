"""Eltwise: element-wise SUM (with coefficients), PROD or MAX of several bottoms."""

from __future__ import annotations

from unroll.core.proto import EltwiseParameter
from unroll.engine.layer import Layer, register_layer
from unroll.engine.memory_traits import MemoryTraits

PROD, SUM, MAX = EltwiseParameter.PROD, EltwiseParameter.SUM, EltwiseParameter.MAX


@register_layer("Eltwise")
class EltwiseLayer(Layer):
    """y = sum_i c_i x_i | prod_i x_i | max_i x_i over >= 2 bottoms of one shape."""

    num_bottoms = (2, None)
    same_shape = True
    #: SUM with coefficient 1 passes a diff through unchanged
    memory = MemoryTraits(passes_diff=lambda layer, k: layer.op == SUM and layer.coeff[k] == 1)

    def __init__(self, param, *args, **kwargs):
        super().__init__(param, *args, **kwargs)
        p = param.eltwise_param
        self.op, self.stable = p.operation, p.stable_prod_grad

    @property
    def backward_reads(self) -> tuple:
        """SUM, MAX: nothing; PROD: bottoms (and top without stable_prod_grad)."""
        # read-only and fixed by the LayerParameter, so known before set-up like a class
        # attribute
        if self.op != PROD:
            return ()
        return ("bottom",) if self.stable else ("bottom", "top")

    def layer_setup(self, bottoms, tops):
        coeff = list(self.param.eltwise_param.coeff)
        if coeff and self.op != SUM:
            raise self.error("coeff is only allowed with operation SUM")
        if coeff and len(coeff) != len(bottoms):
            raise self.error(f"{len(coeff)} coeff given for {len(bottoms)} bottoms; give one each")
        self.coeff = coeff or [1.0] * len(bottoms)

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        for b in bottoms[1:]:
            if b.shape != shape:
                raise self.error(
                    f"bottoms must have one shape: '{bottoms[0].name}' is {shape}, "
                    f"'{b.name}' is {b.shape}"
                )
        tops[0].reshape(shape)
        if self.op == MAX:
            self.reserve("mask", shape, self.xp.int32)

    def forward(self, bottoms, tops):
        xp, y = self.xp, tops[0].data
        if self.op == SUM:
            for i, (b, c) in enumerate(zip(bottoms, self.coeff)):
                if i == 0:
                    if c != 1 or self.coeff[1] != 1:
                        xp.multiply(b.data, c, out=y)
                elif i == 1 and self.coeff[0] == 1 == c:
                    xp.add(bottoms[0].data, b.data, out=y)
                elif c == 1:
                    xp.add(y, b.data, out=y)
                elif c == -1:
                    xp.subtract(y, b.data, out=y)
                else:
                    y += c * b.data
        elif self.op == PROD:
            xp.multiply(bottoms[0].data, bottoms[1].data, out=y)
            for b in bottoms[2:]:
                y *= b.data
        else:
            # the first maximum wins; its bottom alone gets the gradient
            xp.copyto(y, bottoms[0].data)
            mask = self.scratch("mask")
            mask.fill(0)
            for i, b in enumerate(bottoms[1:], 1):
                mask[b.data > y] = i
                xp.maximum(y, b.data, out=y)

    def backward(self, tops, propagate_down, bottoms):
        xp, gy = self.xp, tops[0].diff
        aliased = self.diff_aliased
        for i, b in enumerate(bottoms):
            if not propagate_down[i] or (aliased and aliased[i]):
                continue
            gx = b.diff
            if self.op == SUM:
                xp.multiply(gy, self.coeff[i], out=gx)
            elif self.op == MAX:
                xp.multiply(gy, self.scratch("mask") == i, out=gx)
            elif self.stable:
                others = [o.data for j, o in enumerate(bottoms) if j != i]
                xp.multiply(gy, others[0], out=gx)
                for o in others[1:]:
                    gx *= o
            else:
                xp.divide(tops[0].data, b.data, out=gx)
                gx *= gy
