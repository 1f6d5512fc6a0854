"""Batteries, gradient checkers and hypothesis strategies, for our tests and for yours.

What each check proves, plainly:

- A **gradient check** (backward against central differences) proves that
  backward is consistent with forward: that it is the derivative of whatever
  forward computes. It cannot tell whether forward computes the right thing.
  A cell whose output gate reads c_{t-1} where its equation says c_t, with a
  backward to match, passes every gradient check.
- A **reference** (a NumPy function written from the equation) proves that
  forward is right. Only it catches a wrong equation.
- The other checks prove the contracts a net relies on: bottoms unchanged,
  param diffs accumulated (weight sharing adds every step's gradient into one
  diff), bottom diffs written, in place equal to out of place,
  ``propagate_down`` respected, float32 close to float64, and results that do
  not depend on memory layout; for templates, cont gating (every state reset
  where cont is 0, packed sequences equal to their runs alone, no gradient
  across a sequence boundary).

One call runs them all on one layer, on every device (cpu, trace, gpu where
present)::

    import numpy as np
    from unroll import testing

    def test_my_layer():
        x = np.random.default_rng(0).uniform(-1, 1, (3, 4))
        testing.check_layer('type: "MyLayer"', [x], reference=lambda x: x ** 2)

and on a step template, against its equation written for one step::

    testing.check_template("mycell.prototxt.j2", reference_step=my_step, hidden=8)

The same from the shell: ``unroll check mycell.prototxt.j2 --reference
mymodule:my_step --set hidden=8``. Both raise (or exit 1) naming the check,
the blob, the entry or direction, analytic against numeric, and a hint.

Only the strategies need the ``test`` extra (hypothesis); the checkers do not.

>>> import numpy as np
>>> report = check_layer('type: "Sigmoid"', [np.linspace(-3, 3, 8)],
...                      lambda x: 1 / (1 + np.exp(-x)), devices=["cpu"])
>>> report.passed
True
"""

from unroll.testing.builtins import builtin_templates
from unroll.testing.gradients import (
    GradientMismatch,
    check_layer_gradient,
    check_net_gradient,
    numeric_gradient,
    run_layer,
)
from unroll.testing.layer_battery import available_devices, check_layer
from unroll.testing.report import BatteryFailure, Check, Report
from unroll.testing.strategies import (
    CONT_KINDS,
    arrays,
    axes,
    cont_pattern,
    cont_patterns,
    distinct_arrays,
    fillers,
    random_nets,
    shapes,
    step_variables,
)
from unroll.testing.template_battery import check_template, static_inputs, unrolled_reference

__all__ = [
    "BatteryFailure",
    "CONT_KINDS",
    "Check",
    "GradientMismatch",
    "Report",
    "arrays",
    "available_devices",
    "axes",
    "builtin_templates",
    "check_layer",
    "check_layer_gradient",
    "check_net_gradient",
    "check_template",
    "cont_pattern",
    "cont_patterns",
    "distinct_arrays",
    "fillers",
    "numeric_gradient",
    "random_nets",
    "run_layer",
    "shapes",
    "static_inputs",
    "step_variables",
    "unrolled_reference",
]
