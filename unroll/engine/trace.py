"""A NumPy-backed stand-in for CuPy that counts what a GPU would do.

``device="trace"`` (``get_array_module("trace")``) runs a net on the CPU
through this module in place of CuPy, and counts

- **launches**: every array operation that would be a kernel on a GPU (each
  element-wise operation, reduction, product, copy, fill, gather, scatter,
  random draw) and every custom kernel (:func:`custom_kernel`);
- **syncs**: every point where the host waits for the device: a conversion
  to a Python scalar, bool or list, a device-to-host copy, and each operation
  whose result shape depends on the data (``flatnonzero``, ``nonzero``,
  ``unique``, ``bincount``, boolean-mask indexing);
- **transfers**: host-to-device (``asarray`` of host data, a host array
  written into a device one) and device-to-host (``.get()``, ``asnumpy``).

and **allocations**: every new device buffer (an operation's result, ``empty``,
a transfer's target) and its bytes; :func:`live_bytes` is what the arrays
alive now hold, so a step that keeps nothing new leaves it unchanged.

:func:`capture` records a block's launches as a :class:`Graph` that
:meth:`Graph.launch` replays on the same buffers, as a CUDA graph does (see
:mod:`unroll.engine.cuda_graph`); a sync or a transfer inside it is an error there,
as it is in CUDA's stream capture.

Views (``reshape``, ``transpose``, basic slicing) and allocations
(``empty``) launch nothing. Like CuPy, the module refuses implicit
conversions: ``np.asarray(trace_array)`` and an operation given a NumPy
array raise ``TypeError``, so code that runs here makes no hidden host
round trips on a GPU.

>>> from unroll import trace
>>> with trace.measure() as counts:
...     x = trace.asarray([1.0, 2.0, 3.0])   # one host-to-device transfer
...     y = trace.exp(x) * 2                # two launches
...     total = float(y.sum())              # one launch, one sync
>>> counts.launches, counts.syncs, counts.h2d, total > 0
(3, 1, 1, True)
"""

from __future__ import annotations

import builtins
import contextlib
import operator
import weakref
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np


@dataclass
class Counts:
    """What a GPU would have done; ``ops`` and ``sync_sites`` count by operation name."""

    launches: int = 0
    syncs: int = 0
    h2d: int = 0
    d2h: int = 0
    allocations: int = 0
    allocated_bytes: int = 0
    ops: Counter = field(default_factory=Counter)
    sync_sites: Counter = field(default_factory=Counter)

    @property
    def transfers(self) -> int:
        return self.h2d + self.d2h


TOTAL = Counts()
_active: list[Counts] = [TOTAL]


@contextlib.contextmanager
def measure():
    """Count the events of a ``with`` block into a fresh :class:`Counts` (nesting allowed)."""
    counts = Counts()
    _active.append(counts)
    try:
        yield counts
    finally:
        _active.remove(counts)


def _launch(name: str, replay=None) -> None:
    """Count one kernel; while a :func:`capture` records, ``replay()`` is what redoes it."""
    for c in _active:
        c.launches += 1
        c.ops[name] += 1
    if _recording:
        _recording[-1].append((name, replay))


def _sync(name: str) -> None:
    if _recording:
        raise CaptureError(f"a host wait ({name}) during a capture: the host reads a device "
                           f"value, which a CUDA graph cannot hold")
    for c in _active:
        c.syncs += 1
        c.sync_sites[name] += 1


def _h2d() -> None:
    if _recording:
        raise CaptureError("a host-to-device transfer during a capture: a CUDA graph would "
                           "copy from host memory that is gone when it replays")
    for c in _active:
        c.h2d += 1


# -- allocations ------------------------------------------------------------------------

_live: dict[int, int] = {}  # id of a live device buffer -> its bytes


def _allocated(array: np.ndarray) -> None:
    """Count ``array``'s buffer once, when a device array first holds it."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    if id(root) in _live:
        return
    _live[id(root)] = root.nbytes
    weakref.finalize(root, _live.pop, id(root), None)
    for c in _active:
        c.allocations += 1
        c.allocated_bytes += root.nbytes


def live_bytes() -> int:
    """Bytes of every device buffer some array still holds (what a memory pool lends now)."""
    return sum(_live.values())


# -- capture and replay -------------------------------------------------------------------


class CaptureError(RuntimeError):
    """Work inside :func:`capture` that a CUDA graph cannot hold (a sync, a transfer)."""


_recording: list[list] = []  # the launches of the captures under way, innermost last


class Graph:
    """The launches of a :func:`capture`, replayed in order on the buffers they used.

    Host values (a Python scalar argument, a shape) are the ones of the capture;
    device arrays are read as they are at replay, as in a CUDA graph.
    """

    def __init__(self, launches: list):
        self.launches = launches

    def launch(self, stream=None) -> None:
        """Replay: one launch for the host, every captured kernel on the device."""
        _launch("graph.launch", self._replay)
        self._replay()

    def _replay(self) -> None:
        for _, replay in self.launches:
            replay()


@contextlib.contextmanager
def capture():
    """Record the launches of a ``with`` block into a :class:`Graph` (yielded, filled at
    the end). The block's work runs as well: what it computes gives later operations
    their shapes, and the replays repeat it.

    >>> from unroll import trace
    >>> x = trace.ones(2); y = trace.empty_like(x)
    >>> with trace.capture() as graph:
    ...     _ = trace.multiply(x, 3, out=y)
    >>> x[...] = 5
    >>> graph.launch()
    >>> y.get().tolist()
    [15.0, 15.0]
    """
    launches: list = []
    graph = Graph(launches)
    _recording.append(launches)
    try:
        yield graph
    finally:
        _recording.remove(launches)


def _d2h(name: str) -> None:
    _sync(name)
    for c in _active:
        c.d2h += 1


# -- arrays -----------------------------------------------------------------------------


def _unwrap(x, name: str):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray) and x.ndim:
        raise TypeError(
            f"unroll.engine.trace: {name} was given a NumPy array of shape {x.shape}; CuPy refuses "
            f"host arrays in device operations: move it with xp.asarray first"
        )
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(i, name) for i in x)
    return x


def _wrap(r):
    if isinstance(r, np.ndarray):
        return ndarray(r)
    if isinstance(r, np.generic):  # CuPy reductions return 0-d device arrays, not scalars
        return ndarray(np.asarray(r))
    if isinstance(r, tuple):
        return tuple(_wrap(i) for i in r)
    return r


def _call(name: str, fn, args, kwargs, launch: bool = True):
    """Run ``fn`` on the unwrapped arguments; ``out=`` gives back the caller's own array."""
    out = kwargs.get("out")
    args, kwargs = _unwrap(args, name), {k: _unwrap(v, name) for k, v in kwargs.items()}
    result = fn(*args, **kwargs)
    wrapped = out if isinstance(out, ndarray) else _wrap(result)
    if launch:
        _launch(name, _replay(fn, args, kwargs, None if out is not None else wrapped))
    return wrapped


def _replay(fn, args, kwargs, into):
    """What redoes ``fn(*args, **kwargs)``: the result copied into ``into``'s buffer (the
    array the capture gave out), unless ``fn`` writes in place (``out=``)."""
    if not isinstance(into, ndarray):
        return lambda: fn(*args, **kwargs)
    target = into._a
    return lambda: np.copyto(target, fn(*args, **kwargs))


def _shares(result, args) -> bool:
    bases = [a._a for a in args if isinstance(a, ndarray)]
    return isinstance(result, ndarray) and any(np.may_share_memory(result._a, b) for b in bases)


def _is_advanced(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (ndarray, np.ndarray, list)) for i in items)


def _is_mask(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (ndarray, np.ndarray)) and i.dtype == bool for i in items)


def _index(index, name: str):
    """Unwrap an index; a host index array is copied to the device first, as CuPy does."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for i in items:
        if isinstance(i, np.ndarray) and i.ndim:
            _h2d()
            out.append(i)
        else:
            out.append(_unwrap(i, name))
    return tuple(out) if isinstance(index, tuple) else out[0]


class ndarray:  # noqa: N801  (CuPy's and NumPy's name for it)
    """A device array: a NumPy array whose every operation is counted."""

    __slots__ = ("_a",)
    __array_ufunc__ = None  # NumPy operators defer to ours instead of converting
    __hash__ = None  # == is element-wise

    def __init__(self, array: np.ndarray):
        self._a = array
        _allocated(array)

    # -- what costs nothing: metadata and views
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray(self._a.T))

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        return (ndarray(row) for row in self._a)

    def _view(self, name, *args, **kwargs):
        result = _wrap(getattr(self._a, name)(*args, **kwargs))
        if not _shares(result, [self]):
            _launch(name, _replay(getattr(self._a, name), args, kwargs, result))
        return result

    def reshape(self, *shape, **kwargs):
        return self._view("reshape", *shape, **kwargs)

    def ravel(self, *args, **kwargs):
        return self._view("ravel", *args, **kwargs)

    def transpose(self, *axes):
        return self._view("transpose", *axes)

    def swapaxes(self, a, b):
        return self._view("swapaxes", a, b)

    def squeeze(self, *args, **kwargs):
        return self._view("squeeze", *args, **kwargs)

    def view(self, *args, **kwargs):
        return self._view("view", *args, **kwargs)

    # -- what waits for the device
    def get(self) -> np.ndarray:
        """A NumPy copy on the host (CuPy's ``get``): one device-to-host transfer."""
        _d2h("get")
        return self._a.copy()

    def tolist(self):
        _d2h("tolist")
        return self._a.tolist()

    def __array__(self, *args, **kwargs):
        raise TypeError(
            "unroll.engine.trace: implicit conversion of a device array to NumPy is not allowed "
            "(as in CuPy); use .get() or unroll.engine.backend.to_numpy"
        )

    def __repr__(self) -> str:
        return f"trace.ndarray({self._a!r})"

    # -- what launches a kernel
    def __getitem__(self, index):
        if _is_mask(index):
            _sync("boolean index")
        at = _index(index, "__getitem__")
        result = _wrap(self._a[at])
        if _is_advanced(index):  # a gather; basic indexing is a view (0-d for one element)
            _launch("__getitem__", _replay(self._a.__getitem__, (at,), {}, result))
        return result

    def __setitem__(self, index, value):
        if isinstance(value, np.ndarray) and value.ndim:
            _h2d()
        else:
            value = _unwrap(value, "__setitem__")
        at = _index(index, "__setitem__")
        self._a[at] = value
        _launch("__setitem__", _replay(self._a.__setitem__, (at, value), {}, None))

    def fill(self, value) -> None:
        _launch("fill", _replay(self._a.fill, (value,), {}, None))
        self._a.fill(value)

    def astype(self, dtype, copy=True, **kwargs):
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return _call("astype", self._a.astype, (dtype,), dict(copy=copy, **kwargs))

    def __copy__(self):
        return self.copy()


def _method(name: str):
    def method(self, *args, **kwargs):
        return _call(name, getattr(self._a, name), args, kwargs)

    method.__name__ = name
    return method


def _operator(dunder: str, ufunc, reflected=False, inplace=False):
    if inplace:
        def op(self, other):
            _call(ufunc.__name__, ufunc, (self, other), dict(out=self))
            return self
    elif reflected:
        def op(self, other):
            return _call(ufunc.__name__, ufunc, (other, self), {})
    else:
        def op(self, other):
            return _call(ufunc.__name__, ufunc, (self, other), {})
    op.__name__ = dunder
    return op


def _unary(dunder: str, ufunc):
    def op(self):
        return _call(ufunc.__name__, ufunc, (self,), {})

    op.__name__ = dunder
    return op


def _host_value(site: str, convert):
    """A conversion to a Python value: the host waits for the device (one sync)."""
    def read(self):
        _sync(site)
        return convert(self._a)

    return read


for _dunder, _site, _convert in (("item", "item", np.ndarray.item), ("__float__", "float", float),
                                 ("__int__", "int", int), ("__index__", "index", operator.index),
                                 ("__bool__", "bool", bool)):
    setattr(ndarray, _dunder, _host_value(_site, _convert))
for _name in ("sum", "mean", "max", "min", "argmax", "argmin", "any", "all", "prod", "std",
              "var", "cumsum", "dot", "clip", "round", "copy", "flatten", "take", "repeat",
              "sort", "argsort"):
    setattr(ndarray, _name, _method(_name))
for _op, _uf in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                 ("truediv", np.true_divide), ("floordiv", np.floor_divide),
                 ("mod", np.remainder), ("pow", np.power), ("matmul", np.matmul),
                 ("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor)):
    setattr(ndarray, f"__{_op}__", _operator(f"__{_op}__", _uf))
    setattr(ndarray, f"__r{_op}__", _operator(f"__r{_op}__", _uf, reflected=True))
    setattr(ndarray, f"__i{_op}__", _operator(f"__i{_op}__", _uf, inplace=True))
for _op, _uf in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less),
                 ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal)):
    setattr(ndarray, f"__{_op}__", _operator(f"__{_op}__", _uf))
for _op, _uf in (("neg", np.negative), ("pos", np.positive), ("abs", np.absolute),
                 ("invert", np.invert)):
    setattr(ndarray, f"__{_op}__", _unary(f"__{_op}__", _uf))


# -- the module's functions ---------------------------------------------------------------


class ufunc:  # noqa: N801  (CuPy's name)
    """A NumPy ufunc on device arrays: each call or method is one launch."""

    def __init__(self, uf: np.ufunc):
        self._uf = uf
        self.__name__ = uf.__name__

    def __call__(self, *args, **kwargs):
        return _call(self.__name__, self._uf, args, kwargs)

    def __getattr__(self, method):
        if method not in ("reduce", "accumulate", "reduceat", "outer", "at"):
            raise AttributeError(f"unroll.engine.trace.{self.__name__} has no attribute {method!r}")
        name = f"{self.__name__}.{method}"
        return lambda *args, **kwargs: _call(name, getattr(self._uf, method), args, kwargs)


def asarray(a, dtype=None, order=None):
    """A device array: no work for a device array of that dtype, else a transfer or a cast."""
    if isinstance(a, ndarray):
        if dtype is None or np.dtype(dtype) == a.dtype:
            return a
        return a.astype(dtype)
    _h2d()
    return ndarray(np.array(a, dtype=dtype, order=order or "K"))


def array(a, dtype=None, copy=True, order="K"):
    """A device copy of ``a`` (one launch) or of host data (one transfer)."""
    if isinstance(a, ndarray):
        return _call("array", np.array, (a,), dict(dtype=dtype, copy=copy, order=order))
    _h2d()
    return ndarray(np.array(a, dtype=dtype, order=order))


def asnumpy(a) -> np.ndarray:
    """CuPy's ``asnumpy``: a host copy (one transfer) of a device array; host data as is."""
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


def custom_kernel(fn, name: str):
    """``fn`` (NumPy arrays in, written in place or returned) counted as ONE kernel launch.

    The trace twin of a fused CuPy kernel (an ElementwiseKernel or RawKernel).

    >>> from unroll import trace
    >>> double = trace.custom_kernel(lambda x, out: np.multiply(x, 2, out=out), "double")
    >>> x = trace.asarray([1.0, 2.0]); y = trace.empty_like(x)
    >>> with trace.measure() as c:
    ...     _ = double(x, y)
    >>> c.launches, c.ops["double"], y.get().tolist()
    (1, 1, [2.0, 4.0])
    """
    def kernel(*args, **kwargs):
        return _call(name, fn, args, kwargs)

    kernel.__name__ = name
    return kernel


def twin(module, names):
    """The trace twin of a fused-kernel module: ``module``'s functions ``names`` (NumPy or
    numba kernels, the CPU's), each counted as one launch, as the GPU module's would be.

    >>> import types
    >>> from unroll import trace
    >>> cpu = types.SimpleNamespace(scale=lambda x, out: np.multiply(x, 3, out=out))
    >>> kernels = trace.twin(cpu, ["scale"])
    >>> x = trace.ones(2); y = trace.empty_like(x)
    >>> with trace.measure() as c:
    ...     _ = kernels.scale(x, y)
    >>> c.ops["scale"], y.get().tolist()
    (1, [3.0, 3.0])
    """
    return SimpleNamespace(**{name: custom_kernel(getattr(module, name), name) for name in names})


class Generator:
    """``random.default_rng(seed)``'s generator: each draw is one launch."""

    def __init__(self, seed=None):
        self._rng = np.random.default_rng(seed)

    def __getattr__(self, name):
        draw = getattr(self._rng, name)
        return lambda *args, **kwargs: _call(f"random.{name}", draw, args, kwargs)


class _Random:
    Generator = Generator

    @staticmethod
    def default_rng(seed=None) -> Generator:
        return Generator(seed)


random = _Random()

#: no device work at all: allocation, metadata, host-side checks
_FREE = frozenset({"empty", "empty_like", "may_share_memory", "shares_memory", "shape",
                   "ndim", "size", "result_type", "can_cast", "promote_types", "iinfo",
                   "finfo", "isscalar"})
#: views unless the result is a copy (then one launch)
_VIEWS = frozenset({"reshape", "ravel", "transpose", "swapaxes", "moveaxis", "squeeze",
                    "expand_dims", "broadcast_to", "atleast_1d", "atleast_2d", "atleast_3d"})
#: the result's shape depends on the data: the host must read it first
_DATA_SHAPED = frozenset({"flatnonzero", "nonzero", "argwhere", "unique", "compress",
                          "extract", "bincount"})


def _function(name: str, fn):
    if name in _FREE:
        return lambda *args, **kwargs: _call(name, fn, args, kwargs, launch=False)
    if name in _VIEWS:
        def view(*args, **kwargs):
            result = _call(name, fn, args, kwargs, launch=False)
            if not _shares(result, args):
                unwrapped = _unwrap(args, name), {k: _unwrap(v, name) for k, v in kwargs.items()}
                _launch(name, _replay(fn, *unwrapped, result))
            return result
        return view

    def op(*args, **kwargs):
        if name in _DATA_SHAPED or (name == "where" and len(args) == 1):
            _sync(name)
        return _call(name, fn, args, kwargs)

    return op


def __getattr__(name: str):
    """NumPy's names, counted: types pass through, ufuncs and functions are wrapped."""
    try:
        attr = getattr(np, name)
    except AttributeError:
        raise AttributeError(f"module 'unroll.engine.trace' (NumPy's API) has no "
                             f"{name!r}") from None
    if isinstance(attr, np.ufunc):
        wrapped = ufunc(attr)
    elif isinstance(attr, type) or not callable(attr):
        return attr  # dtypes (float32, intp), constants (newaxis, pi)
    else:
        wrapped = _function(name, attr)
        wrapped.__name__ = name
    if not hasattr(builtins, name):  # trace.sum must not shadow sum() inside this module
        globals()[name] = wrapped
    return wrapped
