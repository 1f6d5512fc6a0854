"""The layers of an expanding net: their names checked as they come, and the glue layers.

A :class:`NetBuilder` collects what an expansion adds (docs/design.md, 3.
Unrolling): the glue (inputs, per-step slices, concatenations, the mixing of a
given initial state) as protobuf messages, and the rendered layers of steps,
levels and module applications. Every top is checked against the blobs made
before it, so a name two steps share is an error naming both, not a net that
silently reads the wrong blob. It also keeps what the checks after expansion
read (:mod:`unroll.frontend.checks`): the declared shapes, the initial blobs,
the modules' layers.

>>> b = NetBuilder(steps=2, batch=3)
>>> b.input("input", {"x": (2, 3, 4)})
>>> b.slice_steps("x", 2)
['x_t0', 'x_t1']
>>> [lp.type for lp in b.net_param("demo").layer]
['Input', 'Slice']
"""

from __future__ import annotations

from pathlib import Path

from unroll.core.errors import TemplateError
from unroll.core.proto import LayerParameter, NetParameter

__all__ = ["NetBuilder"]


class NetBuilder:
    """Collects the layers of an unrolled net and checks names as it goes.

    ``steps`` and ``batch`` are the net's T and N (a tree net: 1 and its node
    rows); ``search_path`` where the templates it loads are looked up;
    ``chunk`` the steps a row-wise sequence macro runs over at once (None: the
    whole sequence), which the caller's engine chooses (docs/design.md, 6. Memory).
    """

    def __init__(self, steps: int, batch: int, search_path=(), chunk: int | None = None):
        if steps < 1:
            raise TemplateError(f"steps must be >= 1, found {steps}")
        self.T = int(steps)
        self.batch = int(batch)
        self.search_path = tuple(search_path)
        self.chunk = chunk
        self.layers: list[LayerParameter] = []
        self.blocks: list[list[LayerParameter]] = []  # the layers of each recurrent() call
        self.produced: dict[str, str] = {}  # blob name -> who produced it
        self.consumed: set[str] = set()
        #: (where, blob, expected shape with None for any size, what) for the shape check
        self.declared: list[tuple[str, str, tuple, str]] = []
        self._sliced: dict[str, list[str]] = {}
        self._scopes: set[str] = set()
        #: block index of each shared() call -> (module template name, its layers)
        self.modules: dict[int, tuple[str, list[LayerParameter]]] = {}
        #: the files of the templates recurrent(), shared() and tree() loaded
        self.loaded: set[Path] = set()
        #: (where, state, blob) for each state a recurrent layer starts from a given blob
        self.initial_blobs: list[tuple[str, str, str]] = []

    def net_param(self, name: str = "") -> NetParameter:
        net = NetParameter(name=name)
        net.layer.extend(self.layers)
        return net

    def block(self, first: int) -> str:
        """Close the block of the layers added since ``first``: the marker a net template
        prints where they go."""
        self.blocks.append(self.layers[first:])
        return f"#@unroll:block:{len(self.blocks) - 1}"

    def claim_scope(self, scope: str, problem: str) -> None:
        """Reserve ``scope`` for one block; ``problem`` words the error when it is taken."""
        if scope in self._scopes:
            raise TemplateError(problem)
        self._scopes.add(scope)

    # -- glue layers ---------------------------------------------------------
    def add_layer(self, lp: LayerParameter, origin: str) -> None:
        for top in lp.top:
            if top in self.produced and top not in lp.bottom:
                raise TemplateError(
                    f"{origin}: blob '{top}' is already produced by {self.produced[top]}; "
                    f"blob names must be unique across steps"
                )
            self.produced.setdefault(top, origin)
        self.consumed.update(lp.bottom)
        self.layers.append(lp)

    def input(self, name: str, tops: dict) -> None:
        """An Input layer with ``tops`` = {blob name: shape}."""
        lp = LayerParameter(name=name, type="Input", top=list(tops))
        for shape in tops.values():
            lp.input_param.shape.add().dim.extend(shape)
        self.add_layer(lp, f"layer '{name}'")

    def slice_steps(self, blob: str, steps: int) -> list[str]:
        """Names of ``blob`` cut into ``steps`` steps along axis 0 (one Slice per blob, reused)."""
        if blob not in self._sliced:
            names = [f"{blob}_t{t}" for t in range(steps)]
            lp = LayerParameter(name=f"{blob}_slice", type="Slice", bottom=[blob], top=names)
            lp.slice_param.axis = 0
            self.add_layer(lp, f"layer '{lp.name}'")
            self._sliced[blob] = names
        return self._sliced[blob]

    def concat(self, name: str, bottoms: list[str], top: str, axis: int) -> None:
        lp = LayerParameter(name=name, type="Concat", bottom=bottoms, top=[top])
        lp.concat_param.axis = axis
        self.add_layer(lp, f"layer '{name}'")

    def silence(self, name: str, bottoms: list[str]) -> None:
        """A Silence of ``bottoms``: blobs nothing reads, which would dangle as outputs."""
        self.add_layer(LayerParameter(name=name, type="Silence", bottom=bottoms),
                       f"layer '{name}'")

    def power(self, bottom: str, top: str, scale: float, shift: float) -> str:
        """``top`` = shift + scale * ``bottom``, made once per name."""
        if top not in self.produced:
            lp = LayerParameter(name=top, type="Power", bottom=[bottom], top=[top])
            lp.power_param.scale = scale
            lp.power_param.shift = shift
            self.add_layer(lp, f"layer '{top}'")
        return top

    def learned_state(self, sc: str, state: str) -> str:
        """``<sc><state>_init``: a learned (size,) bias on the zero initial state, (1, N, size)."""
        lp = LayerParameter(name=f"{sc}{state}_init", type="Bias", bottom=[f"{sc}{state}_0"],
                            top=[f"{sc}{state}_init"])
        lp.param.add(name=f"{sc}{state}_init")
        lp.bias_param.axis = 2
        self.add_layer(lp, f"layer '{lp.name}'")
        return lp.top[0]

    def mix(self, sc: str, state: str, prev: str, cont: str, t: int, init: str) -> str:
        """cont * prev + (1 - cont) * init: the state entering step t, ``init`` where a
        sequence starts."""
        inv = self.power(cont, f"{cont}_inv", scale=-1.0, shift=1.0)
        kept, fresh, mixed = (f"{sc}{state}_{what}_t{t}" for what in ("kept", "fresh", "in"))
        for name, bottoms in ((kept, [prev, cont]), (fresh, [init, inv])):
            lp = LayerParameter(name=name, type="Scale", bottom=bottoms, top=[name])
            lp.scale_param.axis = 0
            self.add_layer(lp, f"layer '{name}'")
        lp = LayerParameter(name=mixed, type="Eltwise", bottom=[kept, fresh], top=[mixed])
        self.add_layer(lp, f"layer '{mixed}'")
        return mixed
