"""The memory a net may plan, and the error for a net that plans more.

A shape comes from a file (a prototxt, a template's hyper-parameters), and a
dimension of 10**11 is as easy to write as one of 100. A net therefore checks
its memory plan before it allocates anything: its params, the blobs it keeps
and its share of the workspace (:meth:`unroll.engine.net.Net.memory_report` counts
the same) must fit in ``max_bytes``, by default the memory the device has
available now (read with psutil on the host).

>>> import numpy
>>> available_bytes(numpy) > 0
True
>>> print(format_bytes(5 * 2**30), format_bytes(1536))
5.0 GiB 1.5 KiB
"""

from __future__ import annotations

import psutil

from unroll.core.errors import NetError

__all__ = ["available_bytes", "format_bytes", "plan_too_big"]


def available_bytes(xp) -> int:
    """Bytes the device of array module ``xp`` can still give: the host's available memory
    (what the OS could hand out without swapping), or a GPU's free memory and CuPy's pool."""
    if xp.__name__ == "cupy":
        free, _ = xp.cuda.runtime.memGetInfo()
        return int(free) + int(xp.get_default_memory_pool().free_bytes())
    return int(psutil.virtual_memory().available)


def format_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def plan_too_big(net: str, need: int, limit: int, given: bool, largest) -> NetError:
    """The error for net ``net`` planning ``need`` bytes over ``limit``.

    ``given`` says whether the limit is the caller's ``max_bytes`` or the memory
    available; ``largest`` lists ``(what, shape, nbytes, layer)`` of the largest
    blobs or params, the likely culprits.

    >>> print(plan_too_big("n", 2**40, 2**30, True, [("blob 'x'", (2**38,), 2**40,
    ...                    "layer 'in' (Input)")]))
    net 'n': the memory plan needs 1.0 TiB, over the limit of 1.0 GiB (max_bytes); largest: \
blob 'x' (274877906944,) 1.0 TiB, of layer 'in' (Input)
    """
    source = ("max_bytes" if given else
              "the memory available; Net(max_bytes=...) sets another limit")
    who = f"net '{net}'" if net else "the net"
    culprits = "; ".join(f"{what} {tuple(shape)} {format_bytes(nbytes)}, of {layer}"
                         for what, shape, nbytes, layer in largest)
    return NetError(f"{who}: the memory plan needs {format_bytes(need)}, over the limit "
                    f"of {format_bytes(limit)} ({source}); largest: {culprits}")
