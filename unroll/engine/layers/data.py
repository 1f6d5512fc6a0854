"""Input and Silence: where blobs enter the net and where unused ones end."""

from __future__ import annotations

from unroll.engine.layer import Layer, register_layer
from unroll.engine.memory_traits import MemoryTraits


@register_layer("Input")
class InputLayer(Layer):
    """Tops shaped by input_param.shape (one per top, or one for all), filled from outside."""

    memory = MemoryTraits(recomputable=False)  # its top is what the caller set

    num_bottoms = (0, 0)
    num_tops = (1, None)
    backward_reads = ()

    def layer_setup(self, bottoms, tops):
        shapes = [tuple(s.dim) for s in self.param.input_param.shape]
        if len(shapes) not in (0, 1, len(tops)):
            raise self.error(f"{len(shapes)} input_param shapes for {len(tops)} tops; "
                             f"give one shape, or one per top")
        for k, top in enumerate(tops):
            if shapes:
                shape = shapes[0 if len(shapes) == 1 else k]
                if any(d < 0 for d in shape):
                    raise self.error(f"top '{top.name}': negative dimension in shape {shape}")
                top.reshape(shape)

    def reshape(self, bottoms, tops):
        """Nothing: the tops keep the shape the user or the net gave them."""

    def forward(self, bottoms, tops):
        pass

    def backward(self, tops, propagate_down, bottoms):
        pass


@register_layer("Silence")
class SilenceLayer(Layer):
    """No output: consumes its bottoms (any shapes) so they are not net outputs; gx = 0."""

    num_bottoms = (1, None)
    num_tops = (0, 0)
    backward_reads = ()

    def reshape(self, bottoms, tops):
        pass

    def forward(self, bottoms, tops):
        pass

    def backward(self, tops, propagate_down, bottoms):
        for down, bottom in zip(propagate_down, bottoms):
            if down:
                bottom.diff[...] = 0
