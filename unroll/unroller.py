"""Expand step templates to T timesteps: one recurrent step in, an unrolled net out.

A **step template** (Jinja2, ``unroll/templates/lstm.prototxt.j2``) renders the Caffe
layers of ONE timestep. It declares its interface in a literal ``interface``
dict and defines a ``step(s)`` macro, and optionally a ``sequence(s)`` macro
that runs once over the whole (T, N, D) input (Caffe's LSTM projects all x_t
with one InnerProduct before the recurrence)::

    {% set interface = {
        "kind": "step",
        "inputs": ["x"],                       # per-step inputs, cut from (T, N, ...) blobs
        "states": {"h": "hidden"},             # recurrent state -> variable giving its size
        "outputs": ["h"],                      # per-step outputs (a state, or s.output.NAME)
        "defaults": {"hidden": none},          # hyper-parameters; none means required
    } %}
    {% macro step(s) %} ... {% endmacro %}

In the macros, ``s.input.x``, ``s.prev.h``, ``s.state.h``, ``s.output.y`` and
``s.cont`` are blob names computed by Python for step ``s.t``;
``s.blob("gates")`` and ``s.layer("ip")`` name the step's own blobs and layers
(they carry the step index); ``s.param("W")`` names a param, WITHOUT the step
index, so that every step shares it. Hyper-parameters are plain variables.

A **net template** (``"kind": "net"``) renders a whole net and calls
``recurrent(...)`` (see :meth:`NetBuilder.recurrent`) where it wants an
unrolled recurrent layer; ``T`` is the number of steps.

>>> import unroll
>>> net_param = unroll.expand("rnn", steps=3, batch=2, input_dim=4, hidden=5)
>>> unroll.Net(net_param).forward()["h"].shape
(3, 2, 5)
"""

from __future__ import annotations

import functools
import os
import traceback
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import jinja2
from jinja2 import nodes

from unroll.errors import TemplateError
from unroll.proto import LayerParameter, NetParameter, PrototxtError, parse_text, to_text

SUFFIX = ".prototxt.j2"
DIRECTIONS = ("forward", "reverse", "bidirectional")


def builtin_template_dir() -> Path:
    """The folder of the templates shipped with unroll."""
    return Path(str(resources.files("unroll.templates")))


def template_search_path(extra=()) -> list[Path]:
    """Where template names are looked up: ``extra``, then $UNROLL_TEMPLATE_PATH, then built-ins."""
    env = [p for p in os.environ.get("UNROLL_TEMPLATE_PATH", "").split(os.pathsep) if p]
    return [Path(p) for p in (*extra, *env)] + [builtin_template_dir()]


def find_template(template, search_path=()) -> Path:
    """The file of ``template``: a path to a file, or a name like "lstm" on the search path."""
    path = Path(template)
    if path.is_file():
        return path
    dirs = template_search_path(search_path)
    for d in dirs:
        for candidate in (d / f"{template}{SUFFIX}", d / str(template)):
            if candidate.is_file():
                return candidate
    names = sorted(p.name[: -len(SUFFIX)] for d in dirs if d.is_dir() for p in d.glob(f"*{SUFFIX}"))
    raise TemplateError(f"no template '{template}' (a file, or one of: {', '.join(names)})")


@dataclass
class Template:
    """A loaded template: its file, its declared interface and its compiled Jinja2 form."""

    path: Path
    interface: dict
    jinja: jinja2.Template
    macros: frozenset

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def kind(self) -> str:
        return self.interface.get("kind", "step")


def _environment(path: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(path.parent), str(builtin_template_dir())]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _parse(source: str, path: Path, env: jinja2.Environment) -> nodes.Template:
    try:
        return env.parse(source, path.name, str(path))
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"{path.name}:{e.lineno}: template syntax error: {e.message}") from None


def _read_interface(tree: nodes.Template, path: Path) -> dict:
    for node in tree.find_all(nodes.Assign):
        if isinstance(node.target, nodes.Name) and node.target.name == "interface":
            try:
                interface = node.node.as_const()
            except nodes.Impossible:
                raise TemplateError(
                    f"{path.name}:{node.lineno}: 'interface' must be a literal dict"
                ) from None
            if not isinstance(interface, dict):
                raise TemplateError(f"{path.name}:{node.lineno}: 'interface' must be a dict")
            return interface
    raise TemplateError(f"{path.name}: declares no 'interface' ({{% set interface = {{...}} %}})")


def load_template(template, search_path=()) -> Template:
    """Find, parse and check a template by name or path (cached while the file is unchanged)."""
    path = find_template(template, search_path).resolve()
    return _load(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _load(path: Path, mtime_ns: int) -> Template:
    # a bucketed model expands the same templates once per bucket length
    env = _environment(path)
    tree = _parse(path.read_text(), path, env)
    interface = _read_interface(tree, path)
    macros = frozenset(m.name for m in tree.find_all(nodes.Macro))
    kind = interface.get("kind", "step")
    if kind not in ("step", "net"):
        raise TemplateError(f"{path.name}: interface kind must be 'step' or 'net', found {kind!r}")
    if kind == "step":
        for key in ("inputs", "states", "outputs"):
            if key not in interface:
                raise TemplateError(f"{path.name}: a step interface must declare '{key}'")
        unknown = [o for o in interface["outputs"] if not isinstance(o, str)]
        if unknown:
            raise TemplateError(f"{path.name}: outputs must be names, found {unknown}")
        if "step" not in macros:
            raise TemplateError(f"{path.name}: a step template must define {{% macro step(s) %}}")
    return Template(path, interface, env.get_template(path.name), macros)


def _template_line(error: BaseException, path: Path) -> int | None:
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if frame.filename == str(path) or Path(frame.filename).name == path.name:
            return frame.lineno
    return getattr(error, "lineno", None)


def _render_error(template: Template, error: BaseException) -> TemplateError:
    line = _template_line(error, template.path)
    where = f"{template.name}:{line}" if line else template.name
    if isinstance(error, jinja2.UndefinedError):
        return TemplateError(f"{where}: undefined variable: {error.message}")
    return TemplateError(f"{where}: {type(error).__name__}: {error}")


def _hyper(template: Template, variables: dict) -> dict:
    """Template variables: declared defaults, overridden by ``variables``; required ones checked."""
    defaults = dict(template.interface.get("defaults", {}))
    merged = {**defaults, **variables}
    missing = [k for k, v in merged.items() if v is None]
    if missing:
        raise TemplateError(
            f"{template.name}: hyper-parameter(s) {', '.join(sorted(missing))} must be given "
            f"(e.g. --set {missing[0]}=...)"
        )
    return merged


class NetBuilder:
    """Collects the layers of an unrolled net and checks names as it goes.

    The unroller adds glue (input slicing, output concatenation, initial
    states) as protobuf messages, and step layers as rendered and parsed
    templates; the result is one ordinary NetParameter.
    """

    def __init__(self, steps: int, batch: int, search_path=()):
        if steps < 1:
            raise TemplateError(f"steps must be >= 1, found {steps}")
        self.T = int(steps)
        self.batch = int(batch)
        self.search_path = tuple(search_path)
        self.net = NetParameter()
        self.produced: dict[str, str] = {}  # blob name -> who produced it
        self._sliced: dict[str, list[str]] = {}
        self._scopes: set[str] = set()

    # -- glue layers ---------------------------------------------------------
    def add_layer(self, lp: LayerParameter, origin: str) -> None:
        for top in lp.top:
            in_place = top in lp.bottom
            if top in self.produced and not in_place:
                raise TemplateError(
                    f"{origin}: blob '{top}' is already produced by {self.produced[top]}; "
                    f"blob names must be unique across steps"
                )
            self.produced.setdefault(top, origin)
        self.net.layer.add().CopyFrom(lp)

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

    # -- rendering -------------------------------------------------------------
    def render(self, template: Template, macro: str, s, hyper: dict) -> list[LayerParameter]:
        """Render one macro of ``template`` and parse it into layers."""
        try:
            module = template.jinja.make_module(hyper)
            try:
                text = str(getattr(module, macro)(s))
            except Exception:
                # a macro called from Python bypasses Jinja's traceback rewriting, which maps
                # the compiled code's lines back to the template's lines: do it here
                template.jinja.environment.handle_exception()
        except (jinja2.UndefinedError, jinja2.TemplateError, TypeError, ValueError) as e:
            raise _render_error(template, e) from None
        origin = f"{template.name} ({macro}, t={s.t})" if s.t is not None else template.name
        try:
            return list(parse_text(text, NetParameter(), origin).layer)
        except PrototxtError as e:
            raise TemplateError(f"rendered {e}") from None

    def recurrent(
        self,
        step: str,
        bottom: str,
        top: str,
        cont: str = "cont",
        direction: str = "forward",
        layers: int = 1,
        scope: str = "",
        expose_hidden: bool = False,
        sequence_output: bool = True,
        batch: int | None = None,
        steps: int | None = None,
        initial_state: str = "zeros",
        **hyper,
    ) -> str:
        """Unroll ``step`` over ``bottom`` (T, N, D) into ``top`` (T, N, ...).

        Returns the prototxt of the unrolled layers, so a net template places
        them where it calls ``{{ recurrent(...) }}``.

        Called from net templates as ``{{ recurrent("lstm", "emb", "h", hidden=128) }}``.
        ``direction`` is forward, reverse or bidirectional (outputs of the two
        directions concatenated on axis 2); ``layers`` stacks that many
        recurrent layers, each with its own params. ``scope`` prefixes every
        blob, layer and param name. With ``expose_hidden`` the initial states
        (``<scope><state>_0``) are inputs to fill and the final ones are
        outputs ``<scope><state>_T`` (truncated BPTT, see :func:`carry_hidden`).
        With ``sequence_output=False``, ``top`` is only the output after the
        last step, (1, N, ...): a summary of each sequence (a word from its
        characters, say) without concatenating every step. ``batch`` and
        ``steps`` are N and T of ``bottom`` where they differ from the net's.
        ``initial_state="learned"`` starts every sequence (wherever cont is 0,
        and at the first step) from a learned state, a param named
        ``<scope><state>_init`` shared by all steps, instead of zeros.
        """
        template = load_template(step, self.search_path)
        if template.kind != "step":
            raise TemplateError(f"recurrent(): '{step}' is a {template.kind} template, not a step")
        if direction not in DIRECTIONS:
            raise TemplateError(
                f"recurrent({step!r}): direction must be one of {DIRECTIONS}, found {direction!r}"
            )
        if expose_hidden and direction != "forward":
            raise TemplateError(
                f"recurrent({step!r}): expose_hidden carries state forward in time; it needs "
                f"direction='forward', found {direction!r}"
            )
        if layers < 1:
            raise TemplateError(f"recurrent({step!r}): layers must be >= 1, found {layers}")
        if initial_state not in ("zeros", "learned"):
            raise TemplateError(
                f"recurrent({step!r}): initial_state must be 'zeros' or 'learned', found "
                f"{initial_state!r}"
            )
        if initial_state == "learned" and expose_hidden:
            raise TemplateError(
                f"recurrent({step!r}): a learned initial state and expose_hidden (a carried "
                f"one) exclude each other"
            )
        hyper = _hyper(template, hyper)
        run = SimpleNamespace(expose_hidden=expose_hidden, sequence_output=sequence_output,
                              batch=self.batch if batch is None else int(batch),
                              steps=self.T if steps is None else int(steps),
                              learned_init=initial_state == "learned")
        first = len(self.net.layer)
        x = bottom
        for k in range(layers):
            out = top if k == layers - 1 else f"{scope}l{k}_out"
            sc = f"{scope}l{k}_" if layers > 1 else scope
            if direction == "bidirectional":
                fw, bw = f"{out}_fw", f"{out}_bw"
                self._direction(template, hyper, x, fw, cont, False, f"{sc}fw_", run)
                self._direction(template, hyper, x, bw, cont, True, f"{sc}bw_", run)
                self.concat(f"{sc}bi_concat", [fw, bw], out, axis=2)
            else:
                self._direction(template, hyper, x, out, cont, direction == "reverse", sc, run)
            x = out
        block = NetParameter()
        block.layer.extend(self.net.layer[first:])
        return to_text(block)

    def _direction(self, template, hyper, bottom, top, cont, reverse, sc, run):
        if sc in self._scopes:
            raise TemplateError(
                f"{template.name}: scope '{sc}' is used twice; give each recurrent layer its own"
            )
        self._scopes.add(sc)
        iface = template.interface
        T, N = run.steps, run.batch
        names = SimpleNamespace(
            blob=lambda local, t: f"{sc}{local}_t{t}",
            layer=lambda local, t: f"{sc}{local}_t{t}",
            param=lambda local: f"{sc}{local}",
        )
        inputs = {name: bottom for name in iface["inputs"]}
        if "sequence" in template.macros:
            seq_out = {name: f"{sc}{name}_seq" for name in inputs}
            s = SimpleNamespace(
                t=None, T=T, input=SimpleNamespace(**inputs), output=SimpleNamespace(**seq_out),
                blob=lambda local: f"{sc}{local}_seq", layer=lambda local: f"{sc}{local}_seq",
                param=names.param, reverse=reverse,
            )
            layers = self.render(template, "sequence", s, hyper)
            produced = {t for lp in layers for t in lp.top}
            for name, blob in seq_out.items():
                if blob not in produced:
                    raise TemplateError(
                        f"{template.name}: the sequence macro must produce s.output.{name} "
                        f"('{blob}'), but no layer tops it"
                    )
            for lp in layers:
                self.add_layer(lp, f"{template.name} (sequence)")
            inputs = seq_out
        per_step = {name: self.slice_steps(blob, T) for name, blob in inputs.items()}
        conts = self.slice_steps(cont, T)
        states = iface["states"]
        sizes = {}
        for state, size_var in states.items():
            if size_var not in hyper:
                raise TemplateError(
                    f"{template.name}: state '{state}' takes its size from '{size_var}', "
                    f"which is not a hyper-parameter"
                )
            sizes[state] = int(hyper[size_var])
        self.input(f"{sc}initial_state", {f"{sc}{s}_0": (1, N, sizes[s]) for s in states})
        order = range(T - 1, -1, -1) if reverse else range(T)
        prev = {state: f"{sc}{state}_0" for state in states}
        if run.learned_init:
            prev = {state: self._learned_state(sc, state, sizes[state]) for state in states}
            ones = self._power(conts[0], f"{cont}_ones", scale=0.0, shift=1.0)
        outputs = {name: [None] * T for name in iface["outputs"]}
        params_seen = None
        for k, t in enumerate(order, start=1):
            # reverse: the state entering step t comes from t+1, so it continues
            # exactly when t+1 does not start a sequence (cont[t+1] == 1)
            cont_t = conts[t + 1] if reverse and t + 1 < T else conts[t]
            if run.learned_init:
                # the step's own cont-masking becomes a no-op (cont = 1): the mix
                # cont * prev + (1 - cont) * init already restarted where needed
                if k > 1:
                    prev = {name: self._mix(sc, name, prev[name], cont_t, t) for name in states}
                cont_t = ones
            state = {name: f"{sc}{name}_{k}" for name in states}
            extra = {o: names.blob(o, t) for o in iface["outputs"] if o not in states}
            s = SimpleNamespace(
                t=t, T=T, reverse=reverse, cont=cont_t,
                input=SimpleNamespace(**{n: v[t] for n, v in per_step.items()}),
                prev=SimpleNamespace(**prev), state=SimpleNamespace(**state),
                output=SimpleNamespace(**extra),
                blob=lambda local, t=t: names.blob(local, t),
                layer=lambda local, t=t: names.layer(local, t),
                param=names.param,
            )
            layers = self.render(template, "step", s, hyper)
            self._check_step(template, layers, state, extra, t)
            params = {p.name for lp in layers for p in lp.param if p.name}
            if params_seen is None:
                params_seen = params
            elif params != params_seen and not iface.get("params_vary_with_t", False):
                changed = sorted(params ^ params_seen)
                raise TemplateError(
                    f"{template.name}: param name(s) {changed} change with the step index "
                    f"(step {t}), so learnable params would grow with T; name params with "
                    f"s.param(...) or declare \"params_vary_with_t\": true in the interface"
                )
            for lp in layers:
                self.add_layer(lp, f"{template.name} (step t={t})")
            for name in outputs:
                outputs[name][t] = state[name] if name in states else extra[name]
            prev = state
        unread = [prev[state] for state in states if state not in outputs]
        for i, (name, steps) in enumerate(outputs.items()):
            out = top if i == 0 else f"{top}_{name}"
            if run.sequence_output:
                self.concat(f"{sc}{name}_concat", steps, out, axis=0)
                continue
            last = steps[order[-1]]
            lp = LayerParameter(name=f"{sc}{name}_final", type="Reshape", bottom=[last],
                                top=[out])
            lp.reshape_param.shape.dim.extend([0, 0, -1])
            self.add_layer(lp, f"layer '{lp.name}'")
            if name not in states:
                unread += [b for t, b in enumerate(steps) if t != order[-1]]
        if reverse and T > 1 and not any(conts[0] in lp.bottom for lp in self.net.layer):
            # the reverse recurrence never reads cont[0]; without a reader it would dangle
            # as a net output
            unread.append(conts[0])
        if unread and not run.expose_hidden:
            lp = LayerParameter(name=f"{sc}final_state_silence", type="Silence", bottom=unread)
            self.add_layer(lp, f"layer '{lp.name}'")
        if run.expose_hidden:
            for state in states:
                lp = LayerParameter(name=f"{sc}{state}_expose", type="Reshape",
                                    bottom=[prev[state]], top=[f"{sc}{state}_T"])
                lp.reshape_param.shape.dim.extend([0, 0, 0])
                self.add_layer(lp, f"layer '{lp.name}'")

    def _learned_state(self, sc: str, state: str, size: int) -> str:
        """``<sc><state>_init``: a learned (size,) param broadcast over the batch, (1, N, size).

        A Scale with a bias over the zero initial state: the bias is the
        learned state, the scale (multiplying zeros) is frozen.
        """
        lp = LayerParameter(name=f"{sc}{state}_init", type="Scale", bottom=[f"{sc}{state}_0"],
                            top=[f"{sc}{state}_init"])
        lp.param.add(name=f"{sc}{state}_init_scale", lr_mult=0, decay_mult=0)
        lp.param.add(name=f"{sc}{state}_init")
        lp.scale_param.axis = 2
        lp.scale_param.bias_term = True
        self.add_layer(lp, f"layer '{lp.name}'")
        return lp.top[0]

    def _power(self, bottom: str, top: str, scale: float, shift: float) -> str:
        """``top`` = shift + scale * ``bottom``, made once per name."""
        if top not in self.produced:
            lp = LayerParameter(name=top, type="Power", bottom=[bottom], top=[top])
            lp.power_param.scale = scale
            lp.power_param.shift = shift
            self.add_layer(lp, f"layer '{top}'")
        return top

    def _mix(self, sc: str, state: str, prev: str, cont: str, t: int) -> str:
        """cont * prev + (1 - cont) * init: the state entering step t, learned where one starts."""
        inv = self._power(cont, f"{cont}_inv", scale=-1.0, shift=1.0)
        kept, fresh, mixed = (f"{sc}{state}_{what}_t{t}" for what in ("kept", "fresh", "in"))
        for name, bottoms in ((kept, [prev, cont]), (fresh, [f"{sc}{state}_init", inv])):
            lp = LayerParameter(name=name, type="Scale", bottom=bottoms, top=[name])
            lp.scale_param.axis = 0
            self.add_layer(lp, f"layer '{name}'")
        lp = LayerParameter(name=mixed, type="Eltwise", bottom=[kept, fresh], top=[mixed])
        self.add_layer(lp, f"layer '{mixed}'")
        return mixed

    @staticmethod
    def _check_step(template, layers, state, extra, t) -> None:
        produced = {top for lp in layers for top in lp.top}
        for name, blob in {**state, **extra}.items():
            if blob not in produced:
                what = "state" if name in state else "output"
                raise TemplateError(
                    f"{template.name}: declares {what} '{name}' but step {t} never produces it "
                    f"(no layer has top '{blob}', i.e. s.{'state' if name in state else 'output'}"
                    f".{name})"
                )


def expand(template, steps: int, search_path=(), **variables) -> NetParameter:
    """Unroll ``template`` (a built-in name or a path) to ``steps`` timesteps.

    For a step template the result is a whole net: an Input layer making
    ``x`` (T, N, input_dim) and ``cont`` (T, N), the unrolled recurrence, and
    its output ``h`` (T, N, hidden). Variables: ``batch`` (N), ``input_dim``,
    the template's hyper-parameters, and ``direction``, ``layers``,
    ``expose_hidden`` as for :meth:`NetBuilder.recurrent`. For a net template,
    ``variables`` are its hyper-parameters.

    >>> net_param = expand("lstm", steps=4, batch=2, input_dim=3, hidden=5)
    >>> [l.name for l in net_param.layer][:2]
    ['input', 'x_proj_seq']
    """
    template = load_template(template, search_path)
    batch = int(variables.pop("batch", 1))
    builder = NetBuilder(steps, batch, search_path)
    if template.kind == "step":
        input_dim = variables.pop("input_dim", None)
        if input_dim is None:
            raise TemplateError(f"{template.name}: expanding a step template needs input_dim=")
        builder.net.name = f"{template.name[: -len(SUFFIX)]}_T{steps}"
        builder.input("input", {"x": (steps, batch, int(input_dim)), "cont": (steps, batch)})
        builder.recurrent(str(template.path), "x", "h", "cont", **variables)
        return builder.net
    hyper = _hyper(template, variables)
    hyper.update(T=builder.T, batch=batch, recurrent=builder.recurrent)
    try:
        text = template.jinja.render(hyper)
    except TemplateError:
        raise
    except (jinja2.UndefinedError, jinja2.TemplateError, TypeError, ValueError) as e:
        raise _render_error(template, e) from None
    try:
        net = parse_text(text, NetParameter(), f"{template.name} (rendered)")
    except PrototxtError as e:
        raise TemplateError(str(e)) from None
    block_tops = set(builder.produced)
    outer_tops = [t for lp in net.layer for t in lp.top if t not in lp.bottom]
    collisions = sorted({t for t in outer_tops if t in block_tops and outer_tops.count(t) > 1})
    if collisions:
        raise TemplateError(
            f"{template.name}: blob name(s) {collisions} are made both by the template and by "
            f"an unrolled recurrent() block"
        )
    return net


def to_prototxt(net_param: NetParameter) -> str:
    """Prototxt text of a NetParameter (readable by unroll.Net and by real Caffe)."""
    return to_text(net_param)


def carry_hidden(net) -> list[tuple[str, str]]:
    """Copy each exposed final state ``X_T`` into its initial state ``X_0`` (truncated BPTT).

    Returns the (final, initial) pairs copied. Use between the batches of one
    long stream, on a net expanded with ``expose_hidden=True``.
    """
    pairs = []
    for name in net.outputs:
        if name.endswith("_T") and f"{name[:-2]}_0" in net.inputs:
            initial = f"{name[:-2]}_0"
            net.blobs[initial].data[...] = net.blobs[name].data
            pairs.append((name, initial))
    return pairs
