"""What a layer tells the memory plan, in one declaration a layer author may skip.

Caffe's Layer has its virtuals (``LayerSetUp``, ``Reshape``, ``Forward``,
``Backward``, the bottom and top counts); what only unroll's memory plan reads
of a layer (docs/design.md, 6. Memory) is one frozen :class:`MemoryTraits`, the
class attribute ``memory``. A layer that declares nothing gets the defaults: its
tops are buffers of their own, no diff passes through, no param gradient is
batched, its forward may run again (unless it ``draws_random``), and backward
reads the bottoms its ``backward_reads`` names.

    >>> from dataclasses import replace
    >>> MemoryTraits().recomputable, MemoryTraits().parts_of_whole
    (True, None)
    >>> replace(MemoryTraits(), recomputable=False).recomputable
    False
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

__all__ = ["BatchedParamGradient", "MemoryTraits", "check_traits", "reads_declared_bottoms"]


def reads_declared_bottoms(layer, k: int, bottom_need) -> bool:
    """Whether backward reads bottom ``k``'s data, by the layer's ``backward_reads`` and
    ``backward_reads_bottoms`` alone (the default of :attr:`MemoryTraits.reads_in_backward`).

    >>> from types import SimpleNamespace
    >>> scale = SimpleNamespace(backward_reads=("bottom",), backward_reads_bottoms=(1,))
    >>> [reads_declared_bottoms(scale, k, [True, True]) for k in (0, 1)]
    [False, True]
    """
    return "bottom" in layer.backward_reads and (
        layer.backward_reads_bottoms is None or k in layer.backward_reads_bottoms)


@dataclass(frozen=True)
class BatchedParamGradient:
    """A param gradient that is a GEMM over rows (InnerProduct): the net places the rows of
    every layer that shares the param (one ``key``) back to back and computes the gradient
    once for all of them. Each field is a function of the layer:

    ``key(layer)``: layers with equal keys use their params the same way (the same blobs,
    the same transpose); ``row_widths(layer)``: the widths (x, gy) of the rows ``backward``
    takes; ``backward(layer, x, gy)``: ADD the param gradient of rows ``x`` and top diffs
    ``gy`` (every sharer's, back to back) into the param diffs. A layer told
    ``param_diffs_batched`` leaves its param gradient to the net.
    """

    key: Callable
    row_widths: Callable
    backward: Callable


@dataclass(frozen=True)
class MemoryTraits:
    """What the memory plan reads of a layer class; every field has a safe default.

    - ``shares_bottom``: what of bottom 0 the tops alias ("data", "diff"): the layer makes
      its tops views of the bottom (Reshape: both; Split: data), so they are one buffer.
    - ``parts_of_whole``: "bottoms" (Concat) or "tops" (Slice): the layer joins its parts
      into one whole, or cuts one whole into parts, along its ``axis``; the plan may place
      the parts inside the whole and tells the layer ``parts_in_whole`` (data flags, diff
      flags), for which it then copies nothing.
    - ``passes_diff(layer, k)``: whether bottom ``k``'s diff equals the top's (Eltwise SUM,
      coefficient 1): the plan may give both one buffer and tells the layer
      ``diff_aliased``, the bottoms whose diff it then writes nothing for. None: never.
    - ``reads_in_backward(layer, k, bottom_need)``: whether backward reads bottom ``k``'s
      data, given which bottoms get a gradient: the plan keeps that value until the
      layer's backward. By default what ``backward_reads`` declares.
    - ``batched_param_gradient``: a :class:`BatchedParamGradient`, or None.
    - ``recomputable``: forward may run again, from the same bottoms, to recompute its tops
      for backward (a memory budget): False for a forward that changes state (BatchNorm's
      statistics, a carried hidden state) or reads outside its bottoms, whose values the
      plan then keeps; a layer that ``draws_random`` is never run again either.

    A Concat declares::

        memory = MemoryTraits(parts_of_whole="bottoms")
    """

    shares_bottom: tuple = ()
    parts_of_whole: str | None = None
    passes_diff: Callable | None = None
    reads_in_backward: Callable = reads_declared_bottoms
    batched_param_gradient: BatchedParamGradient | None = None
    recomputable: bool = True


#: field -> (what it must be, the test)
_VALID = {
    "shares_bottom": ('a tuple of "data" and/or "diff"',
                      lambda v: isinstance(v, tuple) and len(set(v)) == len(v)
                      and set(v) <= {"data", "diff"}),
    "parts_of_whole": ('"bottoms", "tops" or None', lambda v: v in (None, "bottoms", "tops")),
    "passes_diff": ("a function (layer, k) -> bool, or None", lambda v: v is None or callable(v)),
    "reads_in_backward": ("a function (layer, k, bottom_need) -> bool", callable),
    "batched_param_gradient": (
        "a BatchedParamGradient of three functions, or None",
        lambda v: v is None or (isinstance(v, BatchedParamGradient)
                                and all(callable(getattr(v, f.name)) for f in fields(v)))),
    "recomputable": ("True or False", lambda v: isinstance(v, bool)),
}


def check_traits(traits, owner: str) -> None:
    """Raise a one-line TypeError naming ``owner`` (a layer class) and the field, where
    ``traits`` is not a valid :class:`MemoryTraits`.

    >>> check_traits(MemoryTraits(parts_of_whole="rows"), "MyLayer")
    Traceback (most recent call last):
    ...
    TypeError: MyLayer.memory: parts_of_whole must be "bottoms", "tops" or None, found 'rows'
    """
    if not isinstance(traits, MemoryTraits):
        raise TypeError(f"{owner}.memory must be a MemoryTraits "
                        f"(unroll.engine.memory_traits), found {type(traits).__name__}")
    for name, (want, valid) in _VALID.items():
        value = getattr(traits, name)
        if not valid(value):
            raise TypeError(f"{owner}.memory: {name} must be {want}, found {value!r}")
