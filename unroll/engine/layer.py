"""Layer base class and the registry of layer types.

A layer follows Caffe's contract::

    set_up(bottoms, tops)                   once, not overridable (Caffe's SetUp): check the
                                            bottom and top counts, layer_setup, reshape
    layer_setup(bottoms, tops)              read parameters, create learnable blobs
    reshape(bottoms, tops)                  whenever bottom shapes change: shape the tops
    forward(bottoms, tops)                  write tops
    backward(tops, propagate_down, bottoms) write bottom diffs, ADD into param diffs

Class attributes declare what the net checks once at build time, before any
layer is set up: how many bottoms and tops the layer takes, whether it may run
in place (top == bottom) and what its backward reads, so the net can prove that
an in-place write never clobbers a value a backward still needs. They are the
class's, never changed per instance: ``set_up`` refuses a layer that changes one.
What only the memory plan reads is one of them, ``memory``, a
:class:`~unroll.engine.memory_traits.MemoryTraits` a layer may leave out (Concat
declares ``memory = MemoryTraits(parts_of_whole="bottoms")``).

A new layer type is one short class::

    @register_layer("Square")
    class SquareLayer(Layer):
        '''y = x ** 2, any shape.'''
        backward_reads = ("bottom",)

        def reshape(self, bottoms, tops):
            tops[0].reshape(bottoms[0].shape)

        def forward(self, bottoms, tops):
            self.xp.multiply(bottoms[0].data, bottoms[0].data, out=tops[0].data)

        def backward(self, tops, propagate_down, bottoms):
            if propagate_down[0]:
                bottoms[0].diff[...] = 2 * bottoms[0].data * tops[0].diff
"""

from __future__ import annotations

import dis
import importlib
import importlib.util
import inspect
import operator
import os
import sys
import types
from types import MappingProxyType

import numpy as np

from unroll.core.errors import NetError
from unroll.core.proto import LayerParameter
from unroll.engine.backend import make_rng
from unroll.engine.blob import Blob
from unroll.engine.fillers import fill
from unroll.engine.memory_traits import MemoryTraits, check_traits

LAYERS: dict[str, type] = {}

#: everything the engine may read of a layer besides the run methods, each declared on
#: :class:`Layer` with its default and its doc: the class attributes the net reads before
#: set-up (a layer never changes them per instance), ``memory`` among them (what only the
#: memory plan reads, one :class:`~unroll.engine.memory_traits.MemoryTraits`), then the
#: hooks (methods) the net and the host checks call. A test holds the engine to it.
CONTRACT = ("num_bottoms", "num_tops", "in_place", "backward_reads", "backward_reads_bottoms",
            "is_loss", "learnable", "checks_host_bottoms", "draws_random", "roles",
            "same_shape", "memory",
            # hooks
            "counts", "allow_force_backward", "check_host_bottom")


def _stored_attributes(code) -> list[str]:
    """The attributes ``code`` (and the code nested in it) stores on ``self``."""
    names = _STORED.get(code)
    if names is None:
        names, before = [], None
        for ins in dis.get_instructions(code):
            if ins.opname == "STORE_ATTR" and before is not None \
                    and before.opname.startswith(("LOAD_FAST", "LOAD_DEREF")):
                # the object stored on is loaded right before (3.13: the last of a pair)
                loaded = before.argval
                if (loaded[-1] if isinstance(loaded, tuple) else loaded) == "self":
                    names.append(ins.argval)
            before = ins
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                names += _stored_attributes(const)
        _STORED[code] = names
    return names


_STORED: dict = {}  # code -> the attributes it stores on self: subclasses share methods
_KEYS_SHARED: set[type] = set()


def _share_instance_keys(cls) -> None:
    """Put every attribute the methods of ``cls`` store on ``self`` into the class's shared
    instance keys, from the class's first instance on.

    Why: CPython (3.11+) keeps an instance's attributes in a table of keys shared by its
    class, which shrinks by one with every instance made. A net makes all its layers before
    it sets any up, so in an unrolled net of a hundred steps the attributes ``layer_setup``
    adds no longer fit, and every attribute read of those layers becomes a dict lookup
    (about 2% of the run loop's instructions at toy sizes). A first instance that stores
    them all while the table has room keeps it for every later one."""
    _KEYS_SHARED.add(cls)
    names = []
    for klass in reversed(cls.__mro__[:-1]):
        for value in vars(klass).values():
            for fn in ((value.fget, value.fset) if isinstance(value, property) else (value,)):
                code = getattr(getattr(fn, "__func__", fn), "__code__", None)
                if code is not None:
                    names += _stored_attributes(code)
    first = object.__new__(cls)
    for name in dict.fromkeys(names):
        if not hasattr(inspect.getattr_static(cls, name, None), "__set__"):  # not a property
            object.__setattr__(first, name, None)


def register_layer(type_name: str):
    """Class decorator: make a Layer subclass the implementation of ``type_name``."""

    def wrap(cls):
        if not (isinstance(cls, type) and issubclass(cls, Layer)):
            raise TypeError(f"@register_layer({type_name!r}) needs a Layer subclass, got {cls!r}")
        if type_name in LAYERS and not _same_definition(LAYERS[type_name], cls):
            raise ValueError(
                f"layer type {type_name!r} is already registered by {LAYERS[type_name]}"
            )
        cls.type = type_name
        LAYERS.setdefault(type_name, cls)  # a class run again keeps the first one's entry
        return cls

    return wrap


def _same_definition(registered: type, cls: type) -> bool:
    """Whether ``cls`` is ``registered``, or the same class statement run again: a module
    executed a second time under its own name (pytest's importlib mode runs a module's
    doctests from a fresh copy once its package has imported it) re-registers its types."""
    return registered is cls or (registered.__module__ == cls.__module__
                                 and registered.__qualname__ == cls.__qualname__)


#: set to 1 to let every Net import the modules its ``type: "Python"`` layers name
ALLOW_PYTHON_ENV = "UNROLL_ALLOW_PYTHON_LAYERS"


def layer_class(param, allow_python: bool = False) -> type:
    """The Layer class for a LayerParameter (its ``type``, or its python_param).

    A ``type: "Python"`` layer imports ``python_param.module``, which runs that
    module's code, so it is refused unless ``allow_python`` or the environment
    variable ``UNROLL_ALLOW_PYTHON_LAYERS=1`` opts in: a downloaded net must not
    run code by being loaded.
    """
    if param.type == "Python":
        return _python_layer_class(param, allow_python)
    try:
        return LAYERS[param.type]
    except KeyError:
        known = ", ".join(sorted(LAYERS))
        raise NetError(
            f"layer '{param.name}': unknown layer type '{param.type}' (known: {known})"
        ) from None


def _python_layer_class(param, allow_python: bool) -> type:
    spec = param.python_param
    where = f"layer '{param.name}' (Python, module '{spec.module}', class '{spec.layer}')"
    if not (allow_python or os.environ.get(ALLOW_PYTHON_ENV) == "1"):
        raise NetError(
            f"{where}: refusing to import module '{spec.module}', since importing runs its "
            f"code; pass allow_python_layers=True to Net, or set {ALLOW_PYTHON_ENV}=1, if "
            f"you trust this net"
        )
    if not all(part.isidentifier() for part in spec.module.split(".")):
        raise NetError(f"{where}: python_param.module '{spec.module}' is not a module path "
                       f"(dotted names, e.g. 'mypackage.layers')")
    if not spec.layer.isidentifier():
        raise NetError(f"{where}: python_param.layer '{spec.layer}' is not a class name")
    # finding a dotted module imports its packages: their code runs too, and whatever it
    # raises (SystemExit included) is the module's failure, not a traceback of ours
    try:
        found = importlib.util.find_spec(spec.module)
    except (Exception, SystemExit) as e:
        raise NetError(f"{where}: cannot find module '{spec.module}': "
                       f"{type(e).__name__}: {e}") from None
    if found is None:
        raise NetError(f"{where}: no module '{spec.module}' on the import path")
    try:
        module = importlib.import_module(spec.module)
    except (Exception, SystemExit) as e:
        raise NetError(f"{where}: importing module '{spec.module}' raised "
                       f"{type(e).__name__}: {e}") from None
    try:
        cls = getattr(module, spec.layer)
    except AttributeError:
        raise NetError(f"{where}: module '{spec.module}' has no '{spec.layer}'") from None
    if not (isinstance(cls, type) and issubclass(cls, Layer)):
        raise NetError(f"{where}: {spec.module}.{spec.layer} is not a unroll Layer")
    return cls


def _class_contract(cls, cached: bool = True) -> tuple:
    """``(attribute, value)`` of the contract attributes ``cls`` holds as plain values (a
    property is the class's own): an instance that holds another value changed one. Looked up
    so, not in vars(layer), which would give every layer of an unrolled net a dict of its own.
    Cached per class; ``cached=False`` looks again (a class attribute changed since)."""
    if cached and cls in _CONTRACTS:
        return _CONTRACTS[cls]
    values = tuple((a, getattr(cls, a)) for a in CONTRACT)
    found = _CONTRACTS[cls] = tuple((a, v) for a, v in values
                                    if not (isinstance(v, property) or callable(v)))
    return found


_CONTRACTS: dict[type, tuple] = {}


def _contract_kept(layer) -> bool:
    """Whether ``layer`` holds its class's value of every contract attribute (as cached by
    :func:`_class_contract`): one read of them all and one comparison, since every layer of
    an unrolled net is set up; naming a changed one is left to the slow path."""
    cls = type(layer)
    if cls not in _READERS:
        pairs = _class_contract(cls)
        # of one name, attrgetter gives the value, not a tuple: such a class looks closer
        _READERS[cls] = ((operator.attrgetter(*(a for a, _ in pairs)),
                          tuple(v for _, v in pairs)) if len(pairs) > 1 else None)
    check = _READERS[cls]
    return check is not None and all(map(operator.is_, check[0](layer), check[1]))


_READERS: dict[type, tuple] = {}


class _NoScratch(dict):
    """The scratch arrays of a layer that reserved none: one empty table shared by every such
    layer, so it must stay empty (``reserve`` gives a layer tables of its own)."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("a layer's scratch arrays are placed after reserve() sized them")

    __setitem__ = setdefault = update = _refuse


#: a layer's scratch tables until its first :meth:`Layer.reserve`: an unrolled net has
#: thousands of layers, most of which never reserve scratch
_NO_SPECS = MappingProxyType({})
_NO_MEMORY = _NoScratch()


class Layer:
    """Base of every layer; see the module docstring for the contract.

    Attributes set for subclasses: ``param`` (the LayerParameter), ``name``,
    ``xp`` (array module), ``dtype``, ``phase`` ("train" or "test"), ``rng``
    (a random generator on the layer's device) and ``blobs`` (learnable
    params, created through :meth:`param_blob`).
    """

    type = "?"
    #: (min, max) bottoms and tops; max None means unbounded
    num_bottoms: tuple = (1, 1)
    num_tops: tuple = (1, 1)
    #: may the top be the bottom's own memory (top name == bottom name)?
    in_place = False
    #: what backward reads besides top diffs and what it saved itself: "bottom" data (so the
    #: layer may not overwrite its bottom in place), "top" data (so no later layer may)
    backward_reads: tuple = ("bottom",)
    #: with "bottom" above: the indices of the bottoms backward reads (None: all), so
    #: the memory plan can reuse the others once forward has read them
    backward_reads_bottoms: tuple | None = None
    #: a loss layer: top 0 gets loss_weight 1 unless the prototxt says otherwise
    is_loss = False
    #: False for layers whose blobs are state, not weights (BatchNorm's statistics):
    #: the net gives them lr_mult and decay_mult 0, so no solver ever updates them
    learnable = True
    #: values of some bottoms must be checked on the host where inputs enter the net (ids,
    #: labels, positions): :meth:`check_host_bottom` is called with each input's values
    checks_host_bottoms = False
    #: forward draws random numbers (Dropout): the layer never runs on a branch thread, so
    #: a concurrent run draws what the serial one does
    draws_random = False
    #: the bottoms' roles, by name, for a recurrent unit (LSTMUnit: ``("c_prev", "x",
    #: "cont")``): a state first (``*_prev``) and ``cont`` last say the unit itself resets
    #: that state where cont is 0, so the unroller's gating check accepts it as the state's
    #: first reader, and cont's leading axes are the state's (a bucketed model ties them);
    #: () for every other layer
    roles: tuple = ()
    #: every top has the shape of every bottom, whatever the parameters (the neurons,
    #: BatchNorm, Eltwise, Split, Softmax): a bucketed model ties each axis of them all
    #: to the same size (:mod:`unroll.train.bucketed_model`)
    same_shape = False
    #: what only the memory plan reads (views of a whole, pass-through diffs, a batched
    #: param gradient, whether forward may run again, ...): the defaults suit a layer that
    #: declares nothing (:mod:`unroll.engine.memory_traits`)
    memory = MemoryTraits()

    # -- what a memory layout tells the layer (set by apply_layout; defaults: nothing placed)
    #: (data, diff) flags per part: which parts live inside the whole (memory.parts_of_whole)
    parts_in_whole: tuple | None = None
    #: per bottom: its diff IS the top's diff, so backward writes nothing for it
    diff_aliased: tuple = ()
    #: the net computes the param gradient for all sharers (memory.batched_param_gradient)
    param_diffs_batched = False
    #: the blobs ``layer_setup`` creates, in order, each "name (shape)" and when it exists
    #: (read by ``unroll layers``; the tests hold every built-in layer to it)
    param_blobs: tuple = ()
    #: the LayerParameter fields the layer reads its parameters from; None: Caffe's
    #: convention, ``<type in snake case>_param`` where LayerParameter has that field
    param_messages: tuple | None = None

    #: scratch name -> (shape, dtype, lives), as sized by :meth:`reserve`
    scratch_specs = _NO_SPECS
    #: scratch name -> its array (a net puts views of its workspace here)
    scratch_memory = _NO_MEMORY
    _host_rng = None  # fills params outside a net; made on first use

    _param = None
    _param_bytes = b""

    def __init__(self, param, xp=np, dtype=np.float32, phase="train", rng=None, make_param=None):
        if type(self) not in _KEYS_SHARED:
            _share_instance_keys(type(self))
        self.param = param
        if self.type == "?" and param.type:  # a class no type registered: a Python layer
            self.type = param.type
        # interned: the nets of every T share one string per layer name
        self.name = sys.intern(param.name) if param.name else self.type
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.phase = phase
        self._rng = rng
        self._make_param = make_param
        self.blobs: list[Blob] = []

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "set_up" in vars(cls):
            raise TypeError(
                f"{cls.__name__} overrides set_up; override layer_setup and reshape instead"
            )
        if "memory" in vars(cls):
            check_traits(cls.memory, cls.__name__)

    @property
    def param(self):
        """The layer's LayerParameter. A net keeps it serialized once the layer is set up
        (:meth:`compact`): a parsed message costs about 2 KB, its bytes a few dozen, and an
        unrolled net has thousands of layers. Parsed again when asked for."""
        if self._param is None:
            self._param = LayerParameter.FromString(self._param_bytes)
        return self._param

    @param.setter
    def param(self, param) -> None:
        self._param = param

    def compact(self) -> None:
        """Keep the LayerParameter as bytes only, until :attr:`param` is read again."""
        if self._param is not None:
            self._param_bytes = self._param.SerializeToString()
            self._param = None

    @property
    def rng(self):
        """The layer's random generator, on its device (``make_rng(xp, 0)`` unless one was
        given). Made on first use: a CuPy generator holds device memory, and an unrolled
        net has hundreds of layers that never draw."""
        if self._rng is None:
            self._rng = make_rng(self.xp, 0)
        return self._rng

    @rng.setter
    def rng(self, rng) -> None:
        self._rng = rng

    # -- the contract ------------------------------------------------------
    def set_up(self, bottoms, tops) -> None:
        """Caffe's SetUp: check the counts, then :meth:`layer_setup`, then :meth:`reshape`.

        >>> from unroll.core.proto import LayerParameter
        >>> relu = LAYERS["ReLU"](LayerParameter(name="r", type="ReLU"))
        >>> x, y = Blob((2, 3), np, np.float32, "x"), Blob((), np, np.float32, "y")
        >>> relu.set_up([x], [y]); y.shape
        (2, 3)
        """
        self.check_counts(len(bottoms), len(tops))
        self.layer_setup(bottoms, tops)
        changed = [] if _contract_kept(self) else [
            a for a, value in _class_contract(type(self)) if getattr(self, a) is not value]
        if changed:  # the class itself may have changed since it was cached: look again
            changed = [a for a, value in _class_contract(type(self), cached=False)
                       if getattr(self, a) is not value]
        if changed:
            raise TypeError(
                f"{type(self).__name__}.layer_setup sets {changed} on the instance; the net read "
                f"them before set-up, so they must be class attributes"
            )
        self.reshape(bottoms, tops)

    def layer_setup(self, bottoms, tops):
        """Read parameters and create learnable blobs (Caffe's LayerSetUp); bottoms are shaped."""

    def reshape(self, bottoms, tops):
        raise NotImplementedError(f"{type(self).__name__}.reshape")

    def forward(self, bottoms, tops):
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def backward(self, tops, propagate_down, bottoms):
        raise NotImplementedError(f"{type(self).__name__}.backward")

    def allow_force_backward(self, bottom_index: int) -> bool:
        """False for bottoms that have no gradient (labels, indices)."""
        return True

    # -- helpers for subclasses ---------------------------------------------
    def param_blob(self, shape, filler=None) -> Blob:
        """Create (or, when shared, receive) the layer's next learnable blob."""
        index = len(self.blobs)
        if self._make_param is not None:
            blob = self._make_param(self, index, tuple(shape), filler)
        else:
            if self._host_rng is None:
                self._host_rng = np.random.default_rng(0)
            blob = Blob(shape, self.xp, self.dtype, f"{self.name}.{index}")
            blob.data[...] = self.xp.asarray(fill(filler, shape, self._host_rng, self.dtype))
        self.blobs.append(blob)
        return blob

    def reserve(self, name: str, shape, dtype=None, lives: str = "both") -> None:
        """Size scratch array ``name`` (call in ``reshape``); :meth:`scratch` returns it.

        Inside a net the memory comes from the shared workspace and lives as
        ``lives`` says: ``"forward"`` (within this layer's forward),
        ``"backward"`` (within its backward) or ``"both"`` (from its forward to
        its backward, e.g. saved gate values). Contents are undefined until
        written.
        """
        spec = (tuple(int(d) for d in shape), np.dtype(dtype or self.dtype), lives)
        if self.scratch_specs is _NO_SPECS:
            self.scratch_specs, self.scratch_memory = {}, {}
        if self.scratch_specs.get(name) != spec:
            self.scratch_specs[name] = spec
            self.scratch_memory.pop(name, None)

    def scratch(self, name: str):
        """The scratch array ``name`` sized by :meth:`reserve`."""
        array = self.scratch_memory.get(name)
        if array is None:  # outside a net, or a net that keeps everything: memory of its own
            shape, dtype, _ = self.scratch_specs[name]
            array = self.scratch_memory[name] = self.xp.zeros(shape, dtype)
        return array

    def error(self, message: str) -> NetError:
        """A NetError that names this layer and its type."""
        return NetError(f"layer '{self.name}' ({self.type}): {message}")

    def check_host_bottom(self, index: int, values: np.ndarray, name: str) -> None:
        """For ``checks_host_bottoms``: raise a NetError naming ``name`` where the host
        ``values`` entering bottom ``index`` are out of the layer's domain."""

    def apply_layout(self, parts_in_whole=None, diff_aliased=(), param_diffs_batched=False):
        """Take what the net's memory layout decided for this layer: which parts live inside
        the whole, which bottom diffs are the top's, whether the net batches the param
        gradient. Called by the net whenever its layout changes; the defaults undo it. The
        net's, not a hook: a method of Layer, so that what it sets joins every layer class's
        shared instance keys (see :func:`_share_instance_keys`)."""
        if parts_in_whole is not None or self.memory.parts_of_whole is None:
            self.parts_in_whole = parts_in_whole
        self.diff_aliased = diff_aliased
        self.param_diffs_batched = param_diffs_batched

    def counts(self) -> tuple:
        """((min, max) bottoms, (min, max) tops): the class attributes, unless a layer's counts
        depend on its parameters, as Caffe's RecurrentLayer's do on ``expose_hidden``
        (Caffe's virtual MinBottomBlobs/MaxBottomBlobs); such a layer overrides this."""
        return self.num_bottoms, self.num_tops

    def check_counts(self, n_bottoms: int, n_tops: int) -> None:
        bottoms, tops = self.counts()
        # every layer of an unrolled net is checked: settle the usual case in one expression
        if (bottoms[0] <= n_bottoms and (bottoms[1] is None or n_bottoms <= bottoms[1])
                and tops[0] <= n_tops and (tops[1] is None or n_tops <= tops[1])):
            return
        for what, n, (lo, hi) in (("bottoms", n_bottoms, bottoms), ("tops", n_tops, tops)):
            if n < lo or (hi is not None and n > hi):
                want = f"{lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'any'}"
                raise self.error(f"takes {want} {what}, found {n}")

    def canonical_axis(self, axis: int, ndim: int) -> int:
        """Caffe's CanonicalAxisIndex: a negative axis counts from the end."""
        if not -ndim <= axis < ndim:
            raise self.error(f"axis {axis} out of range for a {ndim}-D bottom")
        return axis % ndim

    def __repr__(self) -> str:
        blobs = " ".join(str(b.shape) for b in self.blobs)
        return f"<{type(self).__name__} '{self.name}'" + (f": blobs {blobs}>" if blobs else ">")


# Every built-in layer type registers itself when its module is imported. Importing them
# here, once Layer exists, gives whoever builds layers (Net, unroll.testing) all of them.
from unroll.engine import layers as _builtin_layers  # noqa: E402, F401
