"""The nets an expansion builds to check itself, handed to the caller that builds them anyway.

``expand`` checks a net by building it (docs/design.md, 3. Unrolling, "Checks at
expansion"); a caller about to build the same net (a
:class:`~unroll.train.tree_model.TreeModel`, whose deep trees cost seconds a
build) expands inside :func:`checked_nets`, so the check builds the net the
caller's way, once, and the caller takes it instead of building it again. Nets
are matched by their NetParameter's bytes: a net whose NetParameter the caller
changed after expanding, or one ``expand`` returned from its cache (no check,
no build), is not there, and the caller builds it as before.

>>> from unroll.engine.net import Net
>>> from unroll.frontend.unroller import expand
>>> with checked_nets(lambda p: Net(p, phase="test")) as built:
...     net_param = expand("rnn", steps=2, batch=3, input_dim=13, hidden=17)
>>> net = built.take(net_param)
>>> net.phase, net.blobs["h"].shape, built.take(net_param)
('test', (2, 3, 17), None)
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from contextvars import ContextVar

from unroll.core.proto import NetParameter
from unroll.engine.net import Net

__all__ = ["CheckedNets", "build_checked", "checked_nets"]


class CheckedNets:
    """The nets built by ``build(net_param)`` for the checks of one :func:`checked_nets`
    block, each taken once by the NetParameter it was built from."""

    def __init__(self, build):
        self._build, self._nets = build, {}

    def build(self, net_param: NetParameter) -> Net:
        net = self._build(net_param)
        self._nets[net_param.SerializeToString()] = net
        return net

    def take(self, net_param: NetParameter) -> Net | None:
        """The net built of exactly ``net_param`` (None: none was), no longer held here."""
        return self._nets.pop(net_param.SerializeToString(), None)


_CHECKED: ContextVar[CheckedNets | None] = ContextVar("unroll_checked_nets", default=None)


@contextmanager
def checked_nets(build):
    """Within this block, the net an expansion checks is built by ``build(net_param)``,
    and :meth:`CheckedNets.take` hands it over; outside, checks build their own."""
    nets = CheckedNets(build)
    token = _CHECKED.set(nets)
    try:
        yield nets
    finally:
        _CHECKED.reset(token)


def build_checked(net_param: NetParameter, keep) -> Net:
    """The net the check of ``net_param`` builds: the enclosing block's (whose build need
    not keep ``keep``: the check reads their shapes, which every blob keeps), or its own
    keeping ``keep``, unplanned and unlimited: the check never runs it, and the caller's
    own build plans the memory and refuses a net that does not fit (before allocating it)."""
    nets = _CHECKED.get()
    if nets is None:
        return Net(net_param, keep=keep, plan_memory=False, max_bytes=sys.maxsize)
    return nets.build(net_param)
