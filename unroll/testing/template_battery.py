"""check_template: a step template's battery, unrolled, against its one-step equation.

The objective is ``L = sum_o <out_o, R_o>`` over the unrolled net's outputs,
with fixed random ``R_o``. What each check proves is in :mod:`unroll.testing`'s
docstring; the checks of one layer are :func:`~unroll.testing.check_layer`'s.
"""

from __future__ import annotations

import functools
import numbers
import time
from collections.abc import Callable, Sequence

import numpy as np

from unroll.engine.backend import to_numpy
from unroll.testing.layer_battery import _mismatch, available_devices, central_differences
from unroll.testing.report import Check, Report
from unroll.testing.strategies import CONT_KINDS, cont_pattern

__all__ = ["LIMITS", "check_template", "static_inputs", "unrolled_reference"]

FLOAT = np.float64

HINTS = {
    "forward vs reference": "the unrolled forward disagrees with the reference step written "
                            "from the cell's equation: a term of the step is wrong (or the "
                            "reference)",
    "cont: state reset at cont 0": "a state is not multiplied by cont: where a sequence starts, "
                                   "the step still reads the previous sequence's state",
    "cont: packed equals alone": "a sequence packed after another does not give its result "
                                 "alone: some state crosses the boundary ungated",
    "cont: no gradient across a boundary": "gradient flows into an earlier sequence: a state is "
                                           "not gated by cont",
    "backward vs central differences": "the unrolled backward is not the derivative of its "
                                       "forward: a layer's backward is wrong",
    "param diffs accumulate": "a shared param's diff is overwritten, not added to: only one "
                              "step's gradient survives",
    "float32 vs float64": "float32 disagrees with float64: an overflow or a cancellation",
}

#: the largest size of each kind a battery takes: its checks need no more, and a size given
#: on the command line (``unroll check --set steps=1000000``) must not run away; an LSTM at
#: every limit takes about half a minute of CPU (cpu and trace devices)
LIMITS = {"steps": 100, "batch": 16, "input_dim": 64, "directions": 8, "state size": 64}

#: the static check: the unroller refuses a step that reads a state before cont gates it
GATED = "cont: every state gated (expand)"
#: the unrolled layouts a battery runs: expand() options
CONFIGS = {"forward": {}, "reverse": {"direction": "reverse"},
           "bidirectional": {"direction": "bidirectional"}, "stacked": {"layers": 2}}


def _host(array) -> np.ndarray:
    return np.array(to_numpy(array), FLOAT)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_size(variable: str, value, kind: str | None = None) -> None:
    """Refuse a size that is not a whole number from 1 to its limit, naming both."""
    kind = kind or variable
    limit = LIMITS[kind]
    if not _whole(value) or value < 1:
        raise ValueError(f"{variable}={value!r}: expected a whole number from 1 to {limit} "
                         f"(the battery's limit LIMITS[{kind!r}])")
    if value > limit:
        raise ValueError(f"{variable}={value} is over the battery's limit of {limit} "
                         f"(LIMITS[{kind!r}]): its checks need no more")


def _check_sizes(sizes: dict, states: dict, values: dict, seed) -> None:
    for variable, value in sizes.items():
        _check_size(variable, value)
    for size_var in dict.fromkeys(states.values()):
        if values.get(size_var) is not None:  # a missing one is the template's error to word
            _check_size(size_var, values[size_var], "state size")
    if not _whole(seed) or seed < 0:
        raise ValueError(f"seed={seed!r}: expected a whole number >= 0")


def unrolled_reference(reference_step: Callable, x, cont, params: dict, sizes: dict, *,
                       direction: str = "forward", layers: int = 1, initial=None,
                       static: dict | None = None) -> dict:
    """The unrolled net's outputs by ``reference_step``, run step by step in NumPy.

    ``params`` maps the net's param names (``l0_fw_W_xc``, ...) to values;
    each direction and layer's step gets its own, without their scope
    prefix. Every state entering a step is multiplied by its cont (forward:
    cont[t]; reverse, t = T-1..0: cont[t+1], and cont[T-1] at the first
    step). A template's static inputs, ``static`` (``{name: array}``), go to every
    step as the reference's fourth argument. Returns ``{output name: (T, N, size)}``
    with the net's names (``h``, ``h_<output>``); bidirectional and stacked runs give
    ``h`` only.
    """
    T, N = cont.shape
    inp = np.asarray(x, FLOAT)
    outputs = {}
    for k in range(layers):
        scope = f"l{k}_" if layers > 1 else ""
        sides = [("fw_", False), ("bw_", True)] if direction == "bidirectional" else [
            ("", direction == "reverse")]
        per_side = []
        for side, reverse in sides:
            prefix = scope + side
            mine = {n[len(prefix):]: v for n, v in params.items() if n.startswith(prefix)}
            states = {s: (np.zeros((N, size)) if initial is None else initial[s])
                      for s, size in sizes.items()}
            outs: dict = {}
            for t in (range(T - 1, -1, -1) if reverse else range(T)):
                keep = cont[t + 1] if reverse and t + 1 < T else cont[t]
                gated = {s: v * keep[:, None] for s, v in states.items()}
                returned = (reference_step(inp[t], gated, mine) if static is None
                            else reference_step(inp[t], gated, mine, static))
                if not (isinstance(returned, tuple) and len(returned) == 2
                        and all(isinstance(d, dict) for d in returned)):
                    raise TypeError(f"reference_step returned {_shown(returned)}; expected "
                                    f"(outputs, states), two dicts of arrays")
                step_out, states = returned
                for name, value in step_out.items():
                    outs.setdefault(name, [None] * T)[t] = np.asarray(value, FLOAT)
            per_side.append({name: np.stack(v) for name, v in outs.items()})
        first = next(iter(per_side[0]))
        if len(per_side) == 2:
            outputs = {"h": np.concatenate([per_side[0][first], per_side[1][first]], axis=2)}
        else:
            outputs = {("h" if i == 0 else f"h_{name}"): v
                       for i, (name, v) in enumerate(per_side[0].items())}
        inp = outputs["h"]
    return outputs


class _Unrolled:
    """A step template unrolled to T steps on one device and dtype, with force_backward."""

    def __init__(self, template, T, N, D, dtype, device, search_path, variables, options,
                 static):
        from unroll.engine.net import Net
        from unroll.frontend.unroller import expand

        net_param = expand(template, steps=T, batch=N, input_dim=D, search_path=search_path,
                           **variables, **options)
        net_param.force_backward = True  # no loss layer: the battery sets the outputs' diffs
        self.net = Net(net_param, dtype=dtype, device=device)
        self.T, self.N, self.D = T, N, D
        self.static = static  # {name: array}, fed at every forward; FD moves them in place

    @property
    def params(self) -> dict:
        return {p.name: _host(p.blob.data) for p in self.net.learnable_params}

    def set_params(self, values: dict) -> None:
        xp, dtype = self.net.xp, self.net.dtype
        for p in self.net.learnable_params:
            p.blob.data[...] = xp.asarray(np.asarray(values[p.name]).astype(dtype))

    def set_param(self, name: str, value) -> None:
        self.set_params({**self.params, name: value})

    def forward(self, x, cont, initial=None) -> dict:
        feeds = {"x": x, "cont": cont, **self.static}
        for name in self.net.inputs:
            if name not in feeds:
                base = name[:-2] if name.endswith("_0") else name
                value = (initial or {}).get(base)
                shape = self.net.blobs[name].shape
                feeds[name] = np.zeros(shape) if value is None else np.reshape(value, shape)
        return {k: _host(v) for k, v in self.net.forward(**feeds).items()}

    def loss(self, x, cont, R) -> float:
        out = self.forward(x, cont)
        return float(sum((out[k] * r).sum() for k, r in R.items()))

    def gradients(self, x, cont, R, clear=True, initial=None) -> tuple[dict, dict]:
        """Outputs, and the gradients of ``L`` w.r.t. x and every learnable param."""
        out = self.forward(x, cont, initial)
        if clear:
            self.net.clear_param_diffs()
        xp, dtype = self.net.xp, self.net.dtype
        for name, r in R.items():
            self.net.blobs[name].diff[...] = xp.asarray(r.astype(dtype))
        self.net.backward()
        grads = {p.name: _host(p.blob.diff) for p in self.net.learnable_params}
        for name in ("x", *self.static):
            grads[name] = _host(self.net.blobs[f"{name}@0"].diff)
        return out, grads


class _TemplateBattery:
    def __init__(self, template, reference_step, device, report, o):
        self.template, self.reference_step, self.device = template, reference_step, device
        self.report, self.o = report, o

    def row(self, name, subject, passed, worst=float("nan"), detail="") -> None:
        hint = "" if passed else HINTS.get(name, "")
        self.report.add(Check(name, self.device, subject, bool(passed), worst, detail, hint))

    def guarded(self, name, subject, run, *args) -> None:
        """Run one check; an exception in it fails it, the exception named as the cause."""
        try:
            run(*args)
        except Exception as e:  # the net's own failure is the check's finding
            self.report.add(Check.raised(name, self.device, subject, e))

    def build(self, config="forward", T=None, N=None, dtype="float64") -> _Unrolled:
        """The template unrolled, fed the battery's static inputs (of its first N columns)."""
        o = self.o
        N = N or o["batch"]
        static = {name: value.copy() if axis is None else np.take(value, range(N), axis=axis)
                  for name, value in o["static"].items()
                  for axis in [o["static_axes"][name]]}
        return _Unrolled(self.template, T or o["steps"], N, o["input_dim"], dtype,
                         self.device, o["search_path"], o["variables"], CONFIGS[config], static)

    def random_params(self, net: _Unrolled) -> dict:
        rng = np.random.default_rng(self.o["seed"])
        values = {n: rng.uniform(-0.8, 0.8, v.shape) for n, v in net.params.items()}
        net.set_params(values)
        return values

    def inputs(self, net: _Unrolled, seed_offset=0):
        rng = np.random.default_rng(self.o["seed"] + 10 + seed_offset)
        x = rng.uniform(-1, 1, (net.T, net.N, net.D))
        shapes = {k: v.shape for k, v in net.forward(x, np.ones((net.T, net.N))).items()}
        R = {k: rng.uniform(-1, 1, s) for k, s in shapes.items()}
        return x, R

    def run(self) -> None:
        o = self.o
        for config in o["configs"]:
            self.guarded("unroll", config, self.run_config, config)
        self.guarded("cont: state reset at cont 0", "forward", self.check_reset)
        self.guarded("cont: no gradient across a boundary", "forward", self.check_boundary)
        self.guarded("cont: packed equals alone", "forward", self.check_packed_alone)

    def run_config(self, config) -> None:
        o = self.o
        net = self.build(config)
        params = self.random_params(net)
        x, R = self.inputs(net)
        conts = o["conts"] if config == "forward" else o["conts"][-1:]
        for c, cont in enumerate(conts):
            label = f"{config}, cont {o['cont_names'][len(o['conts']) - len(conts) + c]}"
            out, grads = net.gradients(x, cont, R)
            if self.reference_step is not None:
                try:
                    want = unrolled_reference(self.reference_step, x, cont, params,
                                              o["sizes"], **CONFIGS[config],
                                              static=net.static or None)
                except Exception as e:  # a reference that cannot run proves nothing: fail
                    self.report.add(Check.raised("forward vs reference", self.device,
                                                 f"the reference ({label})", e))
                    want = {}
                for name, ref in want.items():
                    worst, detail, ok = _mismatch(f"{name} ({label})", out[name], ref,
                                                  o["ref_rtol"], o["ref_atol"], "net",
                                                  "reference")
                    self.row("forward vs reference", f"{name} ({label})", ok, worst, detail)
            self.gradient(net, x, cont, R, grads, label)
        if config == "forward":
            self.guarded("param diffs accumulate", config, self.check_accumulate, net, x, R)
            self.guarded("float32 vs float64", config, self.check_float32, net, x, R)
            if o["steps"] > 1:
                short = self.build(config, T=1)
                short.set_params(params)
                xs, Rs = self.inputs(short, 1)
                c0 = np.zeros((1, o["batch"]))
                self.gradient(short, xs, c0, Rs, short.gradients(xs, c0, Rs)[1], "T=1")

    def gradient(self, net, x, cont, R, grads, label) -> None:
        o = self.o
        rng = np.random.default_rng(o["seed"] + 2)
        # a static input's diff is the sum of every step's: central differences of L prove it
        subjects = ([("x", x.copy(), x)] + [(n, v.copy(), v) for n, v in net.static.items()]
                    + [(n, v, n) for n, v in net.params.items()])
        for name, value, param in subjects:
            if not isinstance(param, str):
                def set_value(v, held=param):
                    held[...] = v
            else:
                def set_value(v, param=param):
                    net.set_param(param, v)
            per_entry = o["per_entry"] if o["per_entry"] is not None else np.size(value) <= 16
            worst, detail, ok = central_differences(
                f"{name} ({label})", grads[name], value,
                set_value, lambda: net.loss(x, cont, R), directions=o["directions"],
                per_entry=per_entry, eps=o["eps"], rtol=o["rtol"], atol=o["atol"], rng=rng)
            self.row("backward vs central differences", f"{name} ({label})", ok, worst, detail)

    def check_accumulate(self, net, x, R) -> None:
        cont = self.o["conts"][-1]
        _, once = net.gradients(x, cont, R)
        _, twice = net.gradients(x, cont, R, clear=False)
        for name, g in once.items():
            if name == "x" or name in net.static:
                continue
            worst, detail, ok = _mismatch(f"{name} diff after two forward-backwards",
                                          twice[name], 2 * g, 1e-9, 1e-12)
            self.row("param diffs accumulate", name, ok, worst, detail)

    def check_float32(self, net, x, R) -> None:
        cont = self.o["conts"][-1]
        out64, g64 = net.gradients(x, cont, R)
        net32 = self.build(dtype="float32")
        net32.set_params(net.params)
        out32, g32 = net32.gradients(x, cont, R)
        worst, detail, ok = 0.0, "", True
        for what, a, b in [*((f"output {k}", out32[k], out64[k]) for k in out64),
                           *((f"{k} diff", g32[k], g64[k]) for k in g64)]:
            scale = max(float(np.max(np.abs(b), initial=0.0)), 1e-30)
            diff = np.abs(a - b)
            w = float("inf") if not np.isfinite(a).all() else float(diff.max()) / scale
            if w > worst:
                i = np.unravel_index(int(np.argmax(np.where(np.isfinite(diff), diff, np.inf))),
                                     diff.shape)
                worst, detail = w, (f"{what} entry {tuple(int(j) for j in i)}: float32 "
                                    f"{a[i]:.8g}, float64 {b[i]:.8g}")
        ok = worst <= self.o["float32_tol"]
        self.row("float32 vs float64", "outputs and diffs", ok, worst, detail)

    @functools.cached_property
    def gating_case(self):
        """The forward net with random params, its inputs, a packed cont mask and the
        outputs over it (made once for the gating checks; an error making it fails each)."""
        net = self.build()
        params = self.random_params(net)
        x, R = self.inputs(net, 2)
        restart = cont_pattern("packed", self.o["steps"], self.o["batch"], self.o["seed"])
        return net, params, x, R, restart, net.forward(x, restart)

    def check_reset(self) -> None:
        """cont 0 resets every state: a nonzero initial state changes nothing."""
        o = self.o
        net, _, x, _, restart, base = self.gating_case
        rng = np.random.default_rng(o["seed"] + 5)
        for state, size in o["sizes"].items():
            initial = {state: rng.uniform(-1, 1, (o["batch"], size))}
            got = net.forward(x, restart, initial)
            worst, detail, ok = _first_mismatch(
                (f"{name} with a nonzero initial '{state}'", got[name], base[name], "found",
                 "with zeros") for name in base)
            self.row("cont: state reset at cont 0", f"state '{state}' at t=0", ok, worst, detail)

    def check_boundary(self) -> None:
        """Nothing before a sequence's start reaches it: not its inputs, not the gradient."""
        o = self.o
        net, _, x, R, restart, base = self.gating_case
        t0 = int(np.flatnonzero(restart[:, 0] == 0)[-1])
        if t0 == 0:
            return  # one sequence in column 0: no boundary to cross
        rng = np.random.default_rng(o["seed"] + 6)
        moved = x.copy()
        moved[:t0, 0] = rng.uniform(-1, 1, moved[:t0, 0].shape)
        got = net.forward(moved, restart)
        worst, detail, ok = _first_mismatch(
            (f"{name}[{t0}:, 0] after changing x[:{t0}, 0]", got[name][t0:, :1],
             base[name][t0:, :1], "found", "unchanged") for name in base)
        self.row("cont: state reset at cont 0", f"every state at t={t0}", ok, worst, detail)
        only_late = {k: np.zeros_like(r) for k, r in R.items()}
        for k, r in R.items():
            only_late[k][t0:, :1] = r[t0:, :1]
        _, grads = net.gradients(x, restart, only_late)
        worst = float(np.abs(grads["x"][:t0, 0]).max())
        self.row("cont: no gradient across a boundary", f"x[:{t0}, 0]", worst == 0.0, worst,
                 f"d L(steps {t0}.. of column 0) / d x[:{t0}, 0] is {worst:.3g}, not 0")

    def check_packed_alone(self) -> None:
        """Each sequence packed in column 0 gives what it gives run alone."""
        net, params, x, _, restart, base = self.gating_case
        bounds = [*np.flatnonzero(restart[:, 0] == 0).tolist(), self.o["steps"]]
        for a, b in zip(bounds[:-1], bounds[1:]):
            alone = self.build(T=b - a, N=1)
            alone.set_params(params)
            got = alone.forward(x[a:b, :1], np.concatenate([[[0.0]], np.ones((b - a - 1, 1))]))
            worst, detail, ok = _first_mismatch(
                (f"{name} of steps {a}..{b - 1} of column 0", got[name], base[name][a:b, :1],
                 "alone", "packed") for name in base)
            self.row("cont: packed equals alone", f"steps {a}..{b - 1}", ok, worst, detail)


def _first_mismatch(comparisons) -> tuple[float, str, bool]:
    """Exact comparisons (what, got, want, got's name, want's name): the first that
    fails, its worst error and where, or (0, "", True)."""
    for what, got, want, got_name, want_name in comparisons:
        worst, detail, ok = _mismatch(what, got, want, 1e-12, 1e-14, got_name, want_name)
        if not ok:
            return worst, detail, False
    return 0.0, "", True


def static_inputs(template, batch: int, seed: int = 0, search_path=(), **variables) -> dict:
    """Random (seeded) values of a step template's static inputs, in the dims its interface
    declares, for ``batch`` columns and its hyper-parameters (``variables`` over defaults):
    what a test feeds a template whose every step reads a memory.

    >>> {k: v.shape for k, v in static_inputs("lstm_attention", 2, hidden=3).items()}
    {'memory': (4, 2, 3), 'memory_mask': (4, 2)}
    >>> static_inputs("lstm", 2, hidden=3)
    {}
    """
    from unroll.frontend.unroller import load_template

    loaded = load_template(template, search_path)
    values = {**loaded.defaults, **variables}
    rng = np.random.default_rng(seed + 20)
    return {name: rng.uniform(-1, 1, tuple(
        batch if d == "N" else int(values[d] if isinstance(d, str) else d) for d in dims))
        for name, dims in loaded.interface.get("static", {}).items()}


def check_template(
    template,
    reference_step: Callable | None = None,
    *,
    steps: int = 5,
    batch: int = 3,
    input_dim: int = 3,
    conts: Sequence | None = None,
    configs: Sequence[str] = ("forward", "bidirectional", "stacked"),
    devices: Sequence[str] | None = None,
    directions: int = 3,
    per_entry: bool | None = None,
    search_path=(),
    seed: int = 0,
    eps: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    ref_rtol: float = 1e-7,
    ref_atol: float = 1e-10,
    float32_tol: float = 1e-4,
    strict: bool = True,
    **variables,
) -> Report:
    """Run a step template's battery; returns the :class:`Report`.

    ``template`` is a built-in name or a path; ``variables`` its
    hyper-parameters (``hidden=8``). The template is unrolled to ``steps``
    steps over ``batch`` columns of ``input_dim`` inputs, float64, with random
    params, on each of ``devices``, in each of ``configs`` ("forward",
    "reverse", "bidirectional", "stacked": two layers), over the cont masks
    ``conts`` (default: one of each kind of
    :func:`~unroll.testing.cont_pattern`, seeded; pass masks drawn by
    :func:`~unroll.testing.cont_patterns` to let hypothesis choose).

    ``reference_step(x_t, states, params) -> (outputs, states)`` is one step
    in NumPy, written from the cell's equation: ``x_t`` is step t's raw input
    (N, D), before any shared input projection; ``states`` maps each state to
    its previous value (N, size), already multiplied by cont_t; ``params`` maps
    each param name (``W_xc``, ``b_c``, ``W_hc``, ...) to its array in Caffe's
    layout. It returns dicts of the step's outputs and new states. A template with
    static inputs (an attention memory) is fed them at random (seeded, in the dims its
    interface declares; :func:`static_inputs`), and its reference takes them as a fourth
    argument, ``{name: array}``; their diffs, summed over the steps, are checked by
    central differences like x's.

    Checks: the unrolled forward against the reference, step by step; cont
    gating (each state reset where cont is 0, packed sequences equal to their
    runs alone, no gradient across a sequence boundary); backward against
    central differences along ``directions`` random directions per blob (x
    and every param), for every cont mask and at T=1; param diffs accumulate;
    float32 within ``float32_tol`` of float64. With ``strict``, a failure
    raises :class:`~unroll.testing.BatteryFailure`. A reference that raises, or
    a check that raises, fails that check, the exception named as its cause.

    ``steps``, ``batch``, ``input_dim``, ``directions`` and each state's size
    (``hidden``) are whole numbers from 1 to their :data:`LIMITS`; anything else
    is a ValueError naming the variable and the limit.

    >>> from unroll.testing.references import rnn_step
    >>> check_template("rnn", rnn_step, steps=3, batch=2, hidden=2, devices=["cpu"],
    ...                configs=["forward"]).passed
    True
    """
    from unroll.core.errors import UngatedStateError
    from unroll.frontend.unroller import expand, load_template

    loaded = load_template(template, search_path)
    _check_sizes(dict(steps=steps, batch=batch, input_dim=input_dim, directions=directions),
                 loaded.interface.get("states", {}), {**loaded.defaults, **variables}, seed)
    taken = sorted({"direction", "layers"} & set(variables))
    if taken:
        raise ValueError(f"check_template: {taken[0]} is chosen by configs= ({list(CONFIGS)}), "
                         f"not given as a variable")
    if loaded.kind == "step":  # a template's own error (a typo in a variable) raises here
        try:
            expand(template, steps=1, batch=1, input_dim=input_dim, search_path=search_path,
                   **variables)
        except UngatedStateError as e:  # the unroller proves gating before anything runs
            report = Report(f"template '{loaded.name}'")
            report.add(Check(GATED, "-", f"state '{e.state}'", False, detail=str(e),
                             hint="a state entering the step is read before it is multiplied "
                                  "by cont: packed sequences would leak into each other"))
            return report.raise_on_failure() if strict else report
    if loaded.kind != "step":
        raise ValueError(f"check_template needs a step template; {loaded.name} is a "
                         f"{loaded.kind} template")
    values = {**loaded.defaults, **variables}
    sizes = {s: int(values[size]) for s, size in loaded.interface["states"].items()}
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown config {unknown[0]!r}; expected some of {list(CONFIGS)}")
    if conts is None:
        conts = [cont_pattern(kind, steps, batch, seed) for kind in CONT_KINDS]
        names = list(CONT_KINDS)
    else:
        conts = [np.asarray(c, FLOAT) for c in conts]
        names = [f"#{i}" for i in range(len(conts))]
    # the packed mask last: the other configs, accumulation and float32 use it
    conts, names = list(conts), list(names)
    report = Report(f"template '{loaded.name}' (T={steps}, N={batch}, D={input_dim}, "
                    f"{', '.join(f'{k}={v}' for k, v in variables.items())})")
    opts = dict(steps=steps, batch=batch, input_dim=input_dim, conts=conts, cont_names=names,
                configs=list(configs), directions=directions, per_entry=per_entry,
                search_path=search_path, seed=seed, eps=eps, rtol=rtol, atol=atol,
                ref_rtol=ref_rtol, ref_atol=ref_atol, float32_tol=float32_tol,
                variables=variables, sizes=sizes,
                static=static_inputs(loaded.path, batch, seed, **variables),
                # a run over fewer columns takes the first ones, along each one's N axis
                static_axes={name: dims.index("N") if "N" in dims else None
                             for name, dims in loaded.interface.get("static", {}).items()})
    start = time.perf_counter()
    for device in devices or available_devices():
        _TemplateBattery(str(loaded.path), reference_step, device, report, opts).run()
    report.seconds = time.perf_counter() - start
    return report.raise_on_failure() if strict else report
