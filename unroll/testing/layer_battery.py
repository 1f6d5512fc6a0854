"""check_layer: every check one layer must pass, in one call, on every device.

The objective is ``L = sum_i <top_i, w_i>`` with fixed random weights ``w_i``,
so a layer's backward, given top diffs ``w_i``, must return ``dL/d(bottom)``
and add ``dL/d(param)`` into its param diffs. What each check proves is in
:mod:`unroll.testing`'s docstring.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from unroll.core.proto import LayerParameter, parse_text
from unroll.engine import trace
from unroll.engine.backend import GPU_AVAILABLE, get_array_module, make_rng, to_numpy
from unroll.engine.blob import Blob
from unroll.engine.layer import layer_class
from unroll.testing.report import Check, Report

__all__ = ["available_devices", "check_layer"]

FLOAT = np.float64

#: blobs with at most this many entries are checked entry by entry (2 forwards each)
PER_ENTRY_MAX = 16

HINTS = {
    "forward vs reference": "forward disagrees with the reference written from the equation: "
                            "the layer's math (or the reference) is wrong",
    "bottoms unchanged": "a bottom's data changed: compute into the top or into scratch, never "
                         "into a bottom (unless the layer runs in place)",
    "backward vs central differences": "backward is not the derivative of forward (a wrong "
                                       "sign, a transposed weight, a dropped or extra term)",
    "param diffs accumulate": "backward overwrites the param diff instead of adding to it (= "
                              "where += belongs): shared weights would keep one step's gradient",
    "bottom diffs written": "backward adds into a bottom diff; Caffe writes bottom diffs (=), "
                            "the net sums several consumers itself",
    "in place equals out of place": "in place, forward overwrites a value backward reads: save "
                                    "it, or declare backward_reads = ('bottom',) / in_place = "
                                    "False",
    "float32 vs float64": "float32 disagrees with float64: an overflow (exp of a large value: "
                          "use a stable form) or a cancellation",
    "non-contiguous bottoms": "the result depends on the bottoms' memory layout (a raw buffer, "
                              "ravel(order='K'), a kernel that ignores strides): honour strides "
                              "or copy with ascontiguousarray",
    "propagate_down": "backward writes (or computes) a bottom's diff though propagate_down is "
                      "False for it, or its other gradients change",
}


def available_devices() -> list[str]:
    """The devices a battery runs on here: "cpu", "trace", and "gpu" where one is present."""
    return ["cpu", "trace"] + (["gpu"] if GPU_AVAILABLE else [])


def _layer_param(spec) -> LayerParameter:
    if isinstance(spec, LayerParameter):
        return spec
    return parse_text(spec, LayerParameter(), "<layer spec>")


def _host(array) -> np.ndarray:
    return np.array(to_numpy(array), FLOAT)


def _laid_out(xp, shape: tuple, dtype, layout: str):
    """A zero array of ``shape`` laid out as ``layout``: a transposed view, or every other
    entry of a wider buffer."""
    if not shape:
        return xp.zeros(shape, dtype)
    if layout == "transposed":
        return xp.zeros(shape[::-1], dtype).transpose()
    return xp.zeros((*shape[:-1], 2 * shape[-1]), dtype)[..., ::2]


class _Bench:
    """One layer built on one device, in one dtype and memory layout, on fixed bottoms."""

    def __init__(self, param, values, xp, dtype, phase, seed, *, in_place=False, layout=None):
        self.xp, self.dtype, self.seed = xp, np.dtype(dtype), seed
        self.values = [np.array(v, FLOAT) for v in values]
        cls = layer_class(param)
        self.layer = cls(param, xp=xp, dtype=dtype, phase=phase, rng=make_rng(xp, seed))
        self.bottoms = []
        for i, v in enumerate(self.values):
            blob = Blob(v.shape, xp, dtype, f"bottom{i}")
            if layout is not None:
                blob.data = _laid_out(xp, v.shape, dtype, layout)
            self.bottoms.append(blob)
        self.restore()
        n_tops = len(param.top) or max(1, cls.num_tops[0]) if cls.num_tops[1] != 0 else 0
        self.tops = ([self.bottoms[0]] if in_place else
                     [Blob((), xp, dtype, f"top{i}") for i in range(n_tops)])
        self.layer.set_up(self.bottoms, self.tops)

    @property
    def params(self) -> list[Blob]:
        return self.layer.blobs

    def restore(self) -> None:
        for blob, v in zip(self.bottoms, self.values):
            blob.data[...] = self.xp.asarray(v.astype(self.dtype))

    def set_params(self, values) -> None:
        for blob, v in zip(self.params, values):
            blob.data[...] = self.xp.asarray(np.asarray(v).astype(self.dtype))

    def forward(self) -> list[np.ndarray]:
        """Tops after a forward on the stored bottoms (restored first: in place, the last
        forward overwrote bottom 0), one random draw for every forward."""
        self.restore()
        self.layer.rng = make_rng(self.xp, self.seed)
        self.layer.forward(self.bottoms, self.tops)
        return [_host(t.data) for t in self.tops]

    def loss(self, weights) -> float:
        return float(sum((t * w).sum() for t, w in zip(self.forward(), weights)))

    def backward(self, weights, propagate) -> tuple[list, list]:
        """Bottom diffs and param diffs after one backward with top diffs ``weights``."""
        for t, w in zip(self.tops, weights):
            t.diff[...] = self.xp.asarray(w.astype(self.dtype))
        self.layer.backward(self.tops, list(propagate), self.bottoms)
        return [_host(b.diff) for b in self.bottoms], [_host(p.diff) for p in self.params]

    def set_diffs(self, bottoms=None, params=None) -> None:
        for blobs, values in ((self.bottoms, bottoms), (self.params, params)):
            for blob, v in zip(blobs, values or ()):
                if v is not None:
                    blob.diff[...] = self.xp.asarray(v.astype(self.dtype))


def _where(index) -> str:
    return "(" + ", ".join(str(int(i)) for i in index) + ")"


def _worst_entry(got, want, rtol, atol):
    """(worst relative error, index of the worst entry, passed) of ``got`` against ``want``."""
    got, want = np.asarray(got, FLOAT), np.asarray(want, FLOAT)
    if got.shape != want.shape:
        return float("inf"), None, False
    if got.size == 0:
        return 0.0, None, True
    diff = np.abs(got - want)
    diff = np.where(np.isnan(diff), np.inf, diff)
    bound = atol + rtol * np.maximum(np.abs(got), np.abs(want))
    i = np.unravel_index(int(np.argmax(diff - bound)), got.shape)
    scale = max(float(np.max(np.abs(want))), atol, 1e-300)
    worst = float(np.max(diff)) / scale
    return worst, i, bool((diff <= bound).all())


def _mismatch(what, got, want, rtol, atol, got_name="found", want_name="expected"):
    """(worst, detail, passed): ``got`` against ``want``, naming the worst entry."""
    got, want = np.asarray(got, FLOAT), np.asarray(want, FLOAT)
    if got.shape != want.shape:
        return float("inf"), f"{what}: shape {got.shape}, {want_name} {want.shape}", False
    worst, i, ok = _worst_entry(got, want, rtol, atol)
    if i is None:
        return worst, "", ok
    return worst, (f"{what} entry {_where(i)}: {got_name} {got[i]:.8g}, {want_name} "
                   f"{want[i]:.8g}"), ok


def central_differences(subject, analytic, value, set_value, loss, *, directions, per_entry,
                  eps, rtol, atol, rng):
    """Check ``analytic`` (the gradient of ``loss()`` w.r.t. an array whose value
    ``set_value`` sets) against central differences: entry by entry (2 runs each), or along
    ``directions`` random unit directions (2 runs each). Returns (worst, detail, passed)."""
    value = np.array(value, FLOAT)
    analytic = np.asarray(analytic, FLOAT)
    if per_entry:
        numeric = np.zeros_like(value)
        for i in np.ndindex(value.shape):
            for sign in (1, -1):
                nudged = value.copy()
                nudged[i] += sign * eps
                set_value(nudged)
                numeric[i] += sign * loss() / (2 * eps)
        set_value(value)
        # an entry's error is measured against the gradient's scale, as a direction's is:
        # the differences of a near-zero entry carry the rounding of the whole loss
        floor = atol + rtol * float(np.max(np.abs(analytic), initial=0.0))
        return _mismatch(subject, analytic, numeric, rtol, floor, "analytic", "numeric")
    norm = float(np.linalg.norm(analytic))
    worst, detail, ok = 0.0, "", True
    for k in range(directions):
        v = rng.standard_normal(value.shape)
        v /= max(float(np.linalg.norm(v)), 1e-300)
        set_value(value + eps * v)
        up = loss()
        set_value(value - eps * v)
        down = loss()
        numeric = (up - down) / (2 * eps)
        a = float((analytic * v).sum())
        err = abs(a - numeric)
        err = float("inf") if np.isnan(err) else err
        scale = max(norm, abs(numeric), atol)
        if err / scale > worst or (err > rtol * scale + atol and ok):
            worst = err / scale
            detail = (f"{subject} along random direction {k}: analytic {a:.10g}, numeric "
                      f"{numeric:.10g}")
        ok = ok and err <= rtol * scale + atol
    set_value(value)
    return worst, detail, ok


class _Battery:
    """The checks of one layer on one device; rows go into ``report``."""

    def __init__(self, param, values, reference, device, report, opts):
        self.param, self.values, self.reference = param, values, reference
        self.device, self.report, self.o = device, report, opts
        self.xp = get_array_module(device)
        self.cls = layer_class(param)

    def bench(self, dtype=FLOAT, **kw) -> _Bench:
        return _Bench(self.param, self.values, self.xp, dtype, self.o["phase"], self.o["seed"],
                      **kw)

    def row(self, name, subject, passed, worst=float("nan"), detail="") -> None:
        hint = "" if passed else HINTS.get(name, "")
        self.report.add(Check(name, self.device, subject, bool(passed), worst, detail, hint))

    def guarded(self, name, subject, run) -> None:
        """Run one check; an exception in the layer fails it, naming the exception."""
        try:
            run()
        except Exception as e:  # the layer's own failure is the check's finding
            self.report.add(Check.raised(name, self.device, subject, e))

    def run(self) -> None:
        o = self.o
        base = self.bench()
        self.base = base
        tops = base.forward()
        after_forward = [_host(b.data) for b in base.bottoms]
        self.tops = tops
        if self.reference is not None:
            self.guarded("forward vs reference", "tops", self.check_reference)
        wrng = np.random.default_rng(o["seed"] + 1)
        self.weights = [wrng.uniform(-1, 1, t.shape) for t in tops]
        n = len(base.bottoms)
        self.grads = (list(o["check"]) if o["check"] is not None else
                      [i for i in range(n) if base.layer.allow_force_backward(i)])
        self.propagate = [i in self.grads for i in range(n)]
        self.params_checked = o["params"] and self.cls.learnable and bool(base.params)
        self.gb, self.gp = base.backward(self.weights, self.propagate)
        after_backward = [_host(b.data) for b in base.bottoms]
        for i in range(n):
            worst, detail, ok = _mismatch(f"bottom {i} after forward", after_forward[i],
                                          self.values[i], 0, 0, "found", "given")
            self.row("bottoms unchanged", f"bottom {i} (forward)", ok, worst, detail)
            worst, detail, ok = _mismatch(f"bottom {i} after backward", after_backward[i],
                                          after_forward[i], 0, 0, "found", "before backward")
            self.row("bottoms unchanged", f"bottom {i} (backward)", ok, worst, detail)
        self.guarded("backward vs central differences", "blobs", self.check_gradient)
        self.guarded("param diffs accumulate", "params", self.check_accumulate)
        if self.cls.in_place and n and base.values[0].shape == tuple(tops[0].shape):
            self.guarded("in place equals out of place", "top 0", self.check_in_place)
        if not getattr(self.cls, "draws_random", False):
            self.guarded("float32 vs float64", "tops and diffs", self.check_float32)
        if o["layouts"]:
            self.guarded("non-contiguous bottoms", "bottoms", self.check_layouts)
        if "diff" not in self.cls.memory.shares_bottom and n:
            self.guarded("propagate_down", "bottoms", self.check_propagate_down)

    # -- the checks --------------------------------------------------------------
    def check_reference(self) -> None:
        blobs = [_host(p.data) for p in self.base.params]
        want = self.reference(*[v.copy() for v in self.values], *blobs)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        if len(want) != len(self.tops):
            self.row("forward vs reference", "tops", False, float("inf"),
                     f"the reference returns {len(want)} arrays for {len(self.tops)} tops")
            return
        if not want:
            self.row("forward vs reference", "no tops", True, 0.0)
        for k, (got, ref) in enumerate(zip(self.tops, want)):
            ref = np.asarray(ref, FLOAT).reshape(np.shape(ref))
            worst, detail, ok = _mismatch(f"top {k}", got, ref, self.o["ref_rtol"],
                                          self.o["ref_atol"], "layer", "reference")
            self.row("forward vs reference", f"top {k}", ok, worst, detail)

    def _gradient(self, subject, analytic, value, set_value, rng) -> None:
        o = self.o
        per_entry = o["per_entry"]
        if per_entry is None:
            per_entry = np.size(value) <= PER_ENTRY_MAX
        base = self.base
        worst, detail, ok = central_differences(
            subject, analytic, value, set_value,
            lambda: base.loss(self.weights), directions=o["directions"], per_entry=per_entry,
            eps=o["eps"], rtol=o["rtol"], atol=o["atol"], rng=rng)
        how = "per entry" if per_entry else f"{o['directions']} directions"
        self.row("backward vs central differences", f"{subject} ({how})", ok, worst, detail)

    def check_gradient(self) -> None:
        base, rng = self.base, np.random.default_rng(self.o["seed"] + 2)
        for i in self.grads:
            def set_bottom(v, i=i):
                base.values[i] = v
            self._gradient(f"bottom {i}", self.gb[i], base.values[i].copy(), set_bottom, rng)
        if self.params_checked:
            for k, blob in enumerate(base.params):
                def set_param(v, blob=blob):
                    blob.data[...] = base.xp.asarray(v.astype(base.dtype))
                self._gradient(f"param {k}", self.gp[k], _host(blob.data), set_param, rng)
        base.restore()

    def fresh_with_params(self, dtype=FLOAT, **kw) -> _Bench:
        bench = self.bench(dtype, **kw)
        bench.set_params([_host(p.data) for p in self.base.params])
        return bench

    def check_accumulate(self) -> None:
        bench = self.fresh_with_params()
        rng = np.random.default_rng(self.o["seed"] + 3)
        if self.params_checked:
            # a forward before each backward: a layer may keep what one backward reads
            # in memory its backward reuses (a layer that runs a net inside)
            for _ in range(2):
                bench.forward()
                _, twice = bench.backward(self.weights, self.propagate)
            preset = [rng.uniform(-1, 1, g.shape) for g in self.gp]
            bench.set_diffs(params=preset)
            bench.forward()
            _, added = bench.backward(self.weights, self.propagate)
            for k, g in enumerate(self.gp):
                worst, detail, ok = _mismatch(
                    f"param {k} diff after two forward-backwards", twice[k], 2 * g, 1e-9, 1e-12)
                if ok:
                    worst, detail, ok = _mismatch(f"param {k} diff preset to P, after backward",
                                                  added[k], preset[k] + g, 1e-9, 1e-12,
                                                  "found", "P + gradient")
                self.row("param diffs accumulate", f"param {k}", ok, worst, detail)
        if "diff" in self.cls.memory.shares_bottom:
            return  # the bottom's diff is the top's: nothing of its own to write
        stale = [rng.uniform(-1, 1, v.shape) if self.propagate[i] else None
                 for i, v in enumerate(self.values)]
        bench.set_diffs(bottoms=stale)
        bench.forward()
        got, _ = bench.backward(self.weights, self.propagate)
        for i in self.grads:
            worst, detail, ok = _mismatch(f"bottom {i} diff (preset to a stale value)", got[i],
                                          self.gb[i], 1e-9, 1e-12)
            self.row("bottom diffs written", f"bottom {i}", ok, worst, detail)

    def check_in_place(self) -> None:
        bench = self.fresh_with_params(in_place=True)
        (top, *_) = bench.forward()
        worst, detail, ok = _mismatch("top 0 in place", top, self.tops[0], 1e-12, 1e-14,
                                      "in place", "out of place")
        self.row("in place equals out of place", "top 0", ok, worst, detail)
        gb, gp = bench.backward(self.weights, self.propagate)
        if self.propagate[0]:
            worst, detail, ok = _mismatch("bottom 0 diff in place", gb[0], self.gb[0], 1e-10,
                                          1e-12, "in place", "out of place")
            self.row("in place equals out of place", "bottom 0 diff", ok, worst, detail)
        if self.params_checked:
            for k, g in enumerate(self.gp):
                worst, detail, ok = _mismatch(f"param {k} diff in place", gp[k], g, 1e-10, 1e-12,
                                              "in place", "out of place")
                self.row("in place equals out of place", f"param {k} diff", ok, worst, detail)

    def _close_normwise(self, what, got, want, tol):
        got, want = np.asarray(got, FLOAT), np.asarray(want, FLOAT)
        if not np.isfinite(got).all() and np.isfinite(want).all():
            i = np.unravel_index(int(np.argmax(~np.isfinite(got))), got.shape)
            return float("inf"), (f"{what} entry {_where(i)}: float32 {got[i]:.6g}, float64 "
                                  f"{want[i]:.8g} (not finite in float32)"), False
        scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
        diff = np.abs(got - want)
        if diff.size == 0:
            return 0.0, "", True
        i = np.unravel_index(int(np.argmax(diff)), diff.shape)
        worst = float(diff[i]) / scale
        return worst, f"{what} entry {_where(i)}: float32 {got[i]:.8g}, float64 {want[i]:.8g}", \
            worst <= tol

    def check_float32(self) -> None:
        bench = self.fresh_with_params(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is this check's finding
            tops = bench.forward()
            gb, gp = bench.backward(self.weights, self.propagate)
        tol = self.o["float32_tol"]
        pairs = [(f"top {k}", tops[k], self.tops[k]) for k in range(len(tops))]
        pairs += [(f"bottom {i} diff", gb[i], self.gb[i]) for i in self.grads]
        if self.params_checked:
            pairs += [(f"param {k} diff", gp[k], self.gp[k]) for k in range(len(gp))]
        for what, got, want in pairs:
            worst, detail, ok = self._close_normwise(what, got, want, tol)
            self.row("float32 vs float64", what, ok, worst, detail)

    def check_layouts(self) -> None:
        layouts = ["strided"] + (["transposed"] if any(v.ndim >= 2 for v in self.values) else [])
        if not any(v.ndim >= 1 and v.size for v in self.values):
            return
        for layout in layouts:
            bench = self.fresh_with_params(layout=layout)
            tops = bench.forward()
            gb, gp = bench.backward(self.weights, self.propagate)
            pairs = [(f"top {k}", tops[k], self.tops[k]) for k in range(len(tops))]
            pairs += [(f"bottom {i} diff", gb[i], self.gb[i]) for i in self.grads]
            if self.params_checked:
                pairs += [(f"param {k} diff", gp[k], self.gp[k]) for k in range(len(gp))]
            worst, detail, ok = 0.0, "", True
            for what, got, want in pairs:
                w, d, o = _mismatch(f"{what} with {layout} bottoms", got, want, 1e-10, 1e-12,
                                    layout, "contiguous")
                if not o and ok or (o == ok and w > worst):
                    worst, detail = w, d
                ok = ok and o
            self.row("non-contiguous bottoms", f"{layout} views", ok, worst, detail)

    def check_propagate_down(self) -> None:
        n = len(self.values)
        rng = np.random.default_rng(self.o["seed"] + 4)
        for off in self.grads or [None]:
            bench = self.fresh_with_params()
            propagate = [self.propagate[i] and i != off for i in range(n)]
            sentinel = [rng.uniform(-1, 1, v.shape) if not propagate[i] else None
                        for i, v in enumerate(self.values)]
            bench.set_diffs(bottoms=sentinel)
            bench.forward()
            gb, gp = bench.backward(self.weights, propagate)
            subject = f"bottom {off} off" if off is not None else "every bottom off"
            worst, detail, ok = 0.0, "", True
            checks = [(f"bottom {i} diff (propagate_down false)", gb[i], sentinel[i])
                      for i in range(n) if not propagate[i]]
            checks += [(f"bottom {i} diff", gb[i], self.gb[i]) for i in range(n) if propagate[i]]
            if self.params_checked:
                checks += [(f"param {k} diff", gp[k], g) for k, g in enumerate(self.gp)]
            for what, got, want in checks:
                w, d, o = _mismatch(what, got, want, 1e-10, 1e-12, "found", "expected")
                if not o and ok:
                    worst, detail = w, d
                ok = ok and o
            self.row("propagate_down", subject, ok, worst, detail)
        if self.device == "trace" and not (self.cls.learnable and self.base.params):
            self.check_no_work()

    def check_no_work(self) -> None:
        """On the trace device, which counts kernel launches: a backward with propagate_down
        false for every bottom, and no param to update, must launch nothing."""
        bench = self.fresh_with_params()
        bench.forward()
        for t, w in zip(bench.tops, self.weights):
            t.diff[...] = bench.xp.asarray(w.astype(bench.dtype))
        with trace.measure() as counts:
            bench.layer.backward(bench.tops, [False] * len(bench.bottoms), bench.bottoms)
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(counts.ops.items()))
        self.row("propagate_down", "every bottom off: no work", counts.launches == 0,
                 float(counts.launches), f"backward launched {counts.launches} operations "
                 f"({ops}) though no bottom wants a gradient and no param is learned")


def check_layer(
    layer,
    inputs: Sequence,
    reference: Callable | None = None,
    *,
    devices: Sequence[str] | None = None,
    directions: int = 3,
    per_entry: bool | None = None,
    check: Sequence[int] | None = None,
    params: bool = True,
    layouts: bool = True,
    phase: str = "train",
    seed: int = 0,
    eps: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    ref_rtol: float = 1e-7,
    ref_atol: float = 1e-10,
    float32_tol: float = 1e-4,
    strict: bool = True,
) -> Report:
    """Run the whole battery on one layer; returns the :class:`Report`.

    ``layer`` is a LayerParameter or its prototxt text, ``inputs`` the bottom
    values (NumPy arrays), ``reference`` a NumPy function of the inputs (then
    the layer's blobs, for a layer that has some: ``reference(x, W, b)``) that
    returns the top (or a tuple of tops) the layer's equation gives. On each
    of ``devices`` (default :func:`available_devices`): forward against
    ``reference``; bottoms unchanged by forward and by backward; backward
    against central differences in float64, along ``directions`` random
    directions per blob, or entry by entry (``per_entry=True``; by default for
    blobs of at most 16 entries); param diffs accumulate (two forward-backwards
    give twice the diff, a preset diff is added to) and bottom diffs are written;
    in place equals out of place (layers that declare ``in_place``); float32
    within ``float32_tol`` (normwise) of float64; strided and transposed-view
    bottoms; and, for each bottom, ``propagate_down`` false leaves its diff
    alone and the other gradients as they were. ``check`` lists the bottoms
    that get gradients (default: those the layer allows). With ``strict`` (the
    default), a failed check raises :class:`BatteryFailure`, an
    AssertionError naming each failed check, its blob and worst entry or
    direction, analytic against numeric, and a hint.

    >>> import numpy as np
    >>> x = np.linspace(-1, 1, 6).reshape(2, 3)
    >>> report = check_layer('type: "TanH"', [x], np.tanh, devices=["cpu"])
    >>> report.passed, report.caught_by()
    (True, [])
    """
    param = _layer_param(layer)
    name = param.name or param.type
    report = Report(f"layer '{name}' ({param.type})")
    opts = dict(directions=directions, per_entry=per_entry, check=check, params=params,
                layouts=layouts, phase=phase, seed=seed, eps=eps, rtol=rtol, atol=atol,
                ref_rtol=ref_rtol, ref_atol=ref_atol, float32_tol=float32_tol)
    start = time.perf_counter()
    values = [np.array(v, FLOAT) for v in inputs]
    for device in devices or available_devices():
        try:
            _Battery(param, values, reference, device, report, opts).run()
        except Exception as e:  # set-up, the first forward or backward failed: nothing to check
            report.add(Check("runs", device, "set-up, forward, backward", False, float("inf"),
                             f"raised {type(e).__name__}: {e}",
                             "the layer cannot run on these bottoms on this device"))
    report.seconds = time.perf_counter() - start
    return report.raise_on_failure() if strict else report
