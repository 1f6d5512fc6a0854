"""Shared modules: a module template applied to several inputs with one set of params.

A net template calls ``{{ shared("tower", ["left", "right"], ["left_feat",
"right_feat"], scope="tower_", hidden=8) }}`` (docs/design.md, 3. Unrolling):
each application renders the module's layers with its own blob and layer
names and the same param names, so backward sums every application's
gradient into one set of params (siamese towers, every level of a pyramid).

>>> from unroll.frontend.builder import NetBuilder
>>> b = NetBuilder(steps=1, batch=2)
>>> b.input("input", {"a": (2, 3), "b": (2, 3)})
>>> shared(b, "tower", ["a", "b"], ["fa", "fb"], scope="t_", hidden=4, embed=2)
'#@unroll:block:0'
>>> sorted({p.name for lp in b.layers for p in lp.param})
['t_W_fc1', 't_W_out', 't_b_fc1', 't_b_out']
"""

from __future__ import annotations

from pathlib import Path

from unroll.core.errors import TemplateError
from unroll.frontend.builder import NetBuilder
from unroll.frontend.render import macro_text, parse_layers, run_module
from unroll.frontend.template import Application, hyper_parameters, load_template, merge_hyper

__all__ = ["SHARED_OPTIONS", "shared"]

#: everything shared() takes besides the module template's hyper-parameters
SHARED_OPTIONS = ("scope", "hyper")


def _applications(what: str, interface: dict, bottoms, tops) -> list[tuple[dict, dict]]:
    """Each application's {input: blob} and {output: blob}, checked against the interface."""
    for name, given in (("bottoms", bottoms), ("tops", tops)):
        if not isinstance(given, (list, tuple)) or not given:
            raise TemplateError(
                f"{what}: {name} must be a non-empty list, one entry per application, found "
                f"{given!r}"
            )
    if len(bottoms) != len(tops):
        raise TemplateError(
            f"{what}: {len(bottoms)} bottoms but {len(tops)} tops; give one top per "
            f"application (bottoms {list(bottoms)}, tops {list(tops)})"
        )
    calls = []
    for i, (bottom, top) in enumerate(zip(bottoms, tops)):
        call = []
        for kind, given in (("inputs", bottom), ("outputs", top)):
            names = interface[kind]
            blobs = [given] if isinstance(given, str) else given
            if not isinstance(blobs, (list, tuple)) or len(blobs) != len(names) or not all(
                    isinstance(b, str) for b in blobs):
                raise TemplateError(
                    f"{what}: application {i} must give {len(names)} blob name(s) for the "
                    f"module's {kind} {names}, found {given!r}"
                )
            call.append(dict(zip(names, blobs)))
        calls.append(tuple(call))
    return calls


def shared(builder: NetBuilder, module, bottoms, tops, *, scope: str = "",
           hyper: dict | None = None, **more_hyper) -> str:
    """Apply module template ``module`` to each of ``bottoms``: one set of params for all.

    Called from net templates as ``{{ shared("tower", ["left", "right"],
    ["left_feat", "right_feat"], scope="tower_", hidden=8) }}``; like
    ``recurrent()``, returns a marker that :func:`~unroll.frontend.unroller.expand`
    replaces with the layers. Each application renders the module's layers once, with
    its own blob and layer names (``s.blob``, ``s.layer`` carry its index)
    and the same param names (``s.param``), so the net holds one set of
    params and backward sums every application's gradient into it. An
    application's bottom and top are blob names, or lists of them where
    the module declares several inputs or outputs. ``scope`` prefixes every
    name, as in ``recurrent()``; the module's hyper-parameters are the
    other keywords, or ``hyper={...}``.
    """
    template = load_template(module, builder.search_path)
    builder.loaded.add(template.path)
    what = f"shared({Path(str(module)).name!r})"
    if template.kind != "module":
        use = "unroll it with recurrent()" if template.kind == "step" else "it renders a net"
        raise TemplateError(
            f"{what}: '{module}' is a {template.kind} template ({use}); shared() applies a "
            f"module template, one declaring \"kind\": \"module\" and a module(s) macro"
        )
    hyper = hyper_parameters(template, merge_hyper(what, more_hyper, hyper),
                             also=SHARED_OPTIONS)
    calls = _applications(what, template.interface, bottoms, tops)
    builder.claim_scope(scope, f"{what}: scope '{scope}' is already used by another "
                               f"recurrent() or shared() call; give each its own, so that "
                               f"their blobs and params stay apart")
    jinja_module = run_module(template, hyper)
    first = len(builder.layers)
    params_seen, layer_names = None, set()
    for i, (inputs, outputs) in enumerate(calls):
        s = Application(scope, i, len(calls), input=inputs, output=outputs)
        where = f"{template.name} (application {i})"
        layers = parse_layers(macro_text(template, jinja_module, "module", s), where)
        missing = sorted(set(outputs.values()) - {top for lp in layers for top in lp.top})
        if missing:
            local = next(k for k, v in outputs.items() if v == missing[0])
            raise TemplateError(
                f"{where}: must produce output '{local}' (s.output.{local}, "
                f"'{missing[0]}'), but no layer tops it"
            )
        repeated = sorted({lp.name for lp in layers} & layer_names)
        if repeated:
            raise TemplateError(
                f"{where}: layer name(s) {repeated} are the same in every application; "
                f"name layers with s.layer(...), which carries the application's index"
            )
        layer_names.update(lp.name for lp in layers)
        params = {spec.name for lp in layers for spec in lp.param if spec.name}
        if params_seen is None:
            params_seen = params
        elif params != params_seen:
            raise TemplateError(
                f"{where}: param name(s) {sorted(params ^ params_seen)} change with the "
                f"application, so the applications would not share them; name params "
                f"with s.param(...)"
            )
        for lp in layers:
            builder.add_layer(lp, where)
    builder.modules[len(builder.blocks)] = (template.name, builder.layers[first:])
    return builder.block(first)
