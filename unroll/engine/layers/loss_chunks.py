"""A loss over a whole (T, N, ...) output, one chunk of time at a time: the pieces
:mod:`unroll.engine.memory.separable` rewrites SoftmaxWithLoss and EuclideanLoss into
(docs/design.md, 6. Memory, the whole-output loss).

Each piece reads its chunk of the output and of the labels (or targets), and the WHOLE
labels (targets) too, for what the whole loss is divided by; its top is its share of the
loss, which a Concat and a Reduction (SUM) add up as the whole layer does. So the pieces
give the whole layer's loss and diffs bit for bit, and the chunk's output, softmax and
diff live only around the chunk's steps.
"""

from __future__ import annotations

from unroll.engine.layer import register_layer
from unroll.engine.layers.loss import EuclideanLossLayer, SoftmaxWithLossLayer


@register_layer("SoftmaxWithLossChunk")
class SoftmaxWithLossChunkLayer(SoftmaxWithLossLayer):
    """SoftmaxWithLoss of a chunk: bottoms scores, labels and the whole output's labels; top
    the loss of each position, (outer * inner,), normalized as the whole's (``loss_param``).

    >>> import numpy as np
    >>> from unroll.testing import run_layer
    >>> scores, labels = np.zeros((1, 2, 3)), np.array([[0.0, 2.0], [1.0, -1.0]])
    >>> _, _, (positions,) = run_layer(
    ...     'type: "SoftmaxWithLossChunk" softmax_param { axis: 2 } '
    ...     'loss_param { ignore_label: -1 normalization: VALID }',
    ...     [scores, labels[:1], labels])
    >>> np.round(positions.data, 4).tolist()  # log 3 / 3 valid labels, each
    [0.3662, 0.3662]
    """

    num_bottoms = (3, 3)
    num_tops = (1, 1)
    is_loss = False  # its shares are summed by the Reduction that is the loss

    def check_host_bottom(self, index: int, values, name: str) -> None:
        """The labels, of the chunk (1) or of the whole (2), as SoftmaxWithLoss's."""
        if index == 2:
            index = 1
        super().check_host_bottom(index, values, name)

    def reshape(self, bottoms, tops):
        super().reshape(bottoms, tops[:1])
        tops[0].reshape((self.dims[0] * self.dims[2],))

    def forward(self, bottoms, tops):
        whole = bottoms[2]

        def normalizer(valid):  # the whole output's: what the whole layer divides by
            if self.ignore is not None:
                valid = whole.data.astype(self.xp.int32) != self.ignore
            return self.normalizer(valid, whole.count // self.dims[2])

        tops[0].data[...] = self.position_losses(bottoms, normalizer)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            self.scores_diff(bottoms, tops[0].diff.reshape(self.dims[0], self.dims[2]))


@register_layer("EuclideanLossChunk")
class EuclideanLossChunkLayer(EuclideanLossLayer):
    """EuclideanLoss of a chunk: bottoms a and b of the chunk; top (1,) the chunk's share of
    the loss, sum((a - b)^2) / (2 N), N the whole output's axis 0, which
    ``input_param { shape { dim: N } }`` gives (read off the whole b's Input: a bottom for
    its length alone would give a diff the whole b's size to every chunk).

    >>> import numpy as np
    >>> from unroll.testing import run_layer
    >>> _, _, (share,) = run_layer('type: "EuclideanLossChunk" input_param { shape { dim: 4 } }',
    ...                            [np.ones((1, 2)), np.zeros((1, 2))])
    >>> share.data.tolist()  # 2 / (2 * 4)
    [0.25]
    """

    is_loss = False  # its shares are summed by the Reduction that is the loss
    param_messages = ("input_param",)

    def layer_setup(self, bottoms, tops):
        shape = self.param.input_param.shape
        if len(shape) != 1 or not shape[0].dim or shape[0].dim[0] < 1:
            found = [list(s.dim) for s in shape]
            raise self.error(f"input_param needs one shape whose dim 0 is the whole output's "
                             f"length (>= 1), found shapes {found}")
        self.steps = shape[0].dim[0]

    def reshape(self, bottoms, tops):
        super().reshape(bottoms, tops)
        tops[0].reshape((1,))

    def forward(self, bottoms, tops):
        a, b = bottoms
        d = self.scratch("diff")
        self.xp.subtract(a.data, b.data.reshape(a.shape), out=d)
        tops[0].data[...] = self.share(d, self.steps)

    def backward(self, tops, propagate_down, bottoms):
        if any(propagate_down):
            self.pass_diffs(bottoms, propagate_down, tops[0].diff.reshape(()) / self.steps)
