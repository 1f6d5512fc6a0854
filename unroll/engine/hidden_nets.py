"""What Caffe's recurrent layers need from the frontend: the unroller, registered by it.

``LSTM`` and ``RNN`` layers (:mod:`unroll.engine.layers.caffe_recurrent`) build a
hidden net by unrolling a step template, which is the frontend's job; the engine
may not import the frontend, which sits above it. So the frontend registers its
``expand`` here when it is imported (``import unroll`` and ``unroll.Net`` see to
that), and the layers call :func:`expand`, saying how many steps a sequence macro
runs over at once (``chunk``): the engine's own weight-gradient chunk, so that the
frontend holds no engine constant (docs/design.md, 3).
"""

from __future__ import annotations

from unroll.core.errors import NetError

_unroller = None


def register_unroller(expand) -> None:
    """Make ``expand(template, steps=..., batch=..., chunk=..., **variables) -> NetParameter`` the
    unroller that recurrent layers use (the frontend calls this once)."""
    global _unroller
    _unroller = expand


def expand(template: str, *, chunk: int | None, **variables):
    """Unroll ``template`` with the registered unroller, its sequence macros over ``chunk``
    steps at once (None: the whole sequence); a NetError if no unroller is registered."""
    if _unroller is None:
        raise NetError(
            f"a recurrent layer needs the unroller to expand template '{template}', and none "
            f"is registered: import unroll.frontend (import unroll does) before building nets "
            f"with LSTM or RNN layers")
    return _unroller(template, chunk=chunk, **variables)
