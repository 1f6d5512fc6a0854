"""The battery against the per-entry checkers: seconds per built-in layer and template.

For each battery entry of unroll.testing.references, the per-entry checker
of before (``check_layer_gradient``: every entry of every blob nudged, CPU)
against ``check_layer`` (every check, on the CPU alone and on every device).
For each built-in step template unrolled to ``--steps`` steps of
``--hidden`` units, ``check_net_gradient`` (per entry, one cont mask, CPU)
against ``check_template`` (three layouts, five cont masks, every check). A
benchmark, not a test.

    python -m bench.bench_battery --hidden 64 --steps 10
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from unroll import testing
from unroll.engine.net import Net
from unroll.frontend.unroller import expand
from unroll.testing.references import LAYER_CASES, STEP_REFERENCES


def seconds(run, *args, **kwargs) -> float:
    start = time.perf_counter()
    run(*args, **kwargs)
    return time.perf_counter() - start


def old_layer_check(case) -> None:
    testing.check_layer_gradient(case.spec, case.inputs, check=case.options.get("check"),
                                 phase=case.options.get("phase", "train"))


def old_template_check(name, T, N, D, H) -> None:
    net_param = expand(name, steps=T, batch=N, input_dim=D, hidden=H)
    net_param.force_backward = True
    target = net_param.layer.add(name="target", type="Input", top=["y"])
    target.input_param.shape.add().dim.extend([T, N, H])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "y"], top=["loss"])
    net = Net(net_param, dtype="float64")
    rng = np.random.default_rng(0)
    net.forward(x=rng.uniform(-1, 1, (T, N, D)), cont=testing.cont_pattern("packed", T, N),
                y=rng.uniform(-1, 1, (T, N, H)))
    testing.check_net_gradient(net, wrt=["x"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--input-dim", type=int, default=3)
    args = parser.parse_args(argv)
    devices = ", ".join(testing.available_devices())
    print(f"layer | per-entry checker, cpu (s) | check_layer, cpu (s) | check_layer, {devices} (s)")
    for kind, cases in LAYER_CASES.items():
        case = cases[0]
        try:
            old = f"{seconds(old_layer_check, case):.3f}"
        except Exception:  # the per-entry checker cannot run a layer without tops (Silence)
            old = "cannot"
        run = (case.spec, case.inputs, case.reference)
        cpu = seconds(testing.check_layer, *run, devices=["cpu"], **case.options)
        every = seconds(testing.check_layer, *run, **case.options)
        print(f"{kind} | {old} | {cpu:.3f} | {every:.3f}")
    T, N, D, H = args.steps, args.batch, args.input_dim, args.hidden
    print(f"\ntemplate (T={T}, N={N}, D={D}, H={H}) | check_net_gradient, cpu (s) | "
          f"check_template, cpu (s) | check_template, {devices} (s)")
    sizes = dict(steps=T, batch=N, input_dim=D, hidden=H)
    for name, step in STEP_REFERENCES.items():
        old = seconds(old_template_check, name, T, N, D, H)
        cpu = seconds(testing.check_template, name, step, devices=["cpu"], **sizes)
        every = seconds(testing.check_template, name, step, **sizes)
        print(f"{name} | {old:.2f} | {cpu:.2f} | {every:.2f}")


if __name__ == "__main__":
    main()
