"""The memory plan: a net's run order in, an immutable layout of its memory out.

Two passes, as a planner of tinygrad's kind (docs/design.md, 6. Memory):
:func:`liveness` reads the run order (the steps of :func:`unroll.graph.build_graph`,
which layers run backward, which blobs stay readable) and gives every buffer its
lifetime; :func:`layout` adds the shapes and gives every buffer its place in the
workspace, with what each layer is told (:class:`LayerFlags`). Nothing here
allocates or runs anything: :mod:`unroll.engine.executor` binds a layout to the
workspace, :class:`unroll.engine.net.Net` hands each layer its flags through
:meth:`~unroll.engine.layer.Layer.apply_layout`. A net built with
``plan_memory=False`` plans nothing: every blob keeps memory of its own.

One module a job:

- :mod:`~unroll.engine.memory.liveness` and :mod:`~unroll.engine.memory.lifetimes`:
  every buffer's lifetime, from the graph alone; :mod:`~unroll.engine.memory.walk`: its
  data touches over arrays, from what each step touches (found once per net);
- :mod:`~unroll.engine.memory.aliases`: the parts of a Concat or Slice inside their
  whole, a diff passed through unchanged (Eltwise SUM) as its bottoms' diff too, resolved
  once per net and shapes into one immutable :class:`Aliases`;
- :mod:`~unroll.engine.memory.weight_gradients`: the rows of the layers that share a
  param back to back, so that its gradient is one GEMM per chunk of
  :data:`GRADIENT_CHUNK` timesteps;
- :mod:`~unroll.engine.memory.placement`: buffers whose lifetimes do not overlap share
  memory (:func:`place`);
- :mod:`~unroll.engine.memory.layout`: all of it for one set of shapes;
- :mod:`~unroll.engine.memory.schedule`: every run's actions in one list (the forward
  pass, backward, recompute runs, weight-gradient GEMMs, zeroing of diffs), which the
  executor runs in one loop;
- :mod:`~unroll.engine.memory.regions`: within a region whose branches run at once
  (:func:`concurrent_regions`) every buffer lives through all of it;
- :mod:`~unroll.engine.memory.segments` and :mod:`~unroll.engine.memory.hsm`: backward
  recomputes segments of the forward from checkpoints (a :class:`Recompute` plan), cut
  between weight-gradient chunks, at one level or at several (BPTT-HSM,
  :func:`hsm_order`);
- :mod:`~unroll.engine.memory.separable`: a loss over a whole (T, N, ...) output rewritten
  into one piece per chunk of time (:func:`separate_losses`), so that a budget reaches below
  it;
- :mod:`~unroll.engine.memory.costs`: what a recomputation plan costs without its liveness
  or layout (:class:`PlanCosts`: its one-level forward runs, a lower bound on its bytes);
- :mod:`~unroll.engine.memory.policy`: which checkpoints to keep, a :class:`Policy`
  (built in, or the user's own: :class:`Checkpoints`), apart from the mechanism,
  :mod:`~unroll.engine.memory.budget`, that plans what a policy weighs and holds it to a
  memory budget (:func:`within_budget`).

>>> import numpy as np
>>> from unroll import Net
>>> net = Net('''
...   layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
...   layer { name: "a" type: "ReLU" bottom: "x" top: "a" }
...   layer { name: "b" type: "TanH" bottom: "a" top: "b" }
...   layer { name: "c" type: "Sigmoid" bottom: "b" top: "c" }''', phase="test")
>>> net.memory.layout.total  # 'a' and 'b' are planned; 'c' is the output: it is kept
128
"""

from unroll.engine.memory.aliases import Aliases, aliases_of
from unroll.engine.memory.budget import Plans, within_budget
from unroll.engine.memory.costs import PlanCosts, plan_costs
from unroll.engine.memory.hsm import bptt_hsm, hsm_order, hsm_units
from unroll.engine.memory.layout import LayerFlags, Layout, input_roots, layout, planned_bytes
from unroll.engine.memory.lifetimes import Lifetimes, Liveness
from unroll.engine.memory.liveness import liveness, private_blobs
from unroll.engine.memory.placement import place
from unroll.engine.memory.policy import (
    BPTTHSM,
    HSM_MOST_FORWARDS,
    Chain,
    Checkpoints,
    ChenSegments,
    FewestRecomputed,
    NoRecompute,
    Plan,
    Policy,
    policy_named,
)
from unroll.engine.memory.regions import Region, concurrent_regions
from unroll.engine.memory.schedule import Action, Schedule, schedule
from unroll.engine.memory.segments import (
    Recomputable,
    Recompute,
    allowed_cuts,
    crossing_bytes,
    greedy_cuts,
    one_level_order,
    recomputable,
)
from unroll.engine.memory.separable import separate_losses
from unroll.engine.memory.weight_gradients import (
    GRADIENT_CHUNK,
    WeightGradGroup,
    gradient_chunks,
    plan_weight_gradients,
    time_chunks,
)

__all__ = ["Action", "Aliases", "BPTTHSM", "GRADIENT_CHUNK", "HSM_MOST_FORWARDS", "Chain",
           "ChenSegments",
           "Checkpoints", "FewestRecomputed", "Layout", "LayerFlags", "Lifetimes", "Liveness",
           "NoRecompute", "Plan", "PlanCosts", "Plans", "Policy", "Recomputable", "Recompute",
           "Region",
           "Schedule", "WeightGradGroup",
           "aliases_of", "allowed_cuts", "bptt_hsm", "concurrent_regions", "crossing_bytes",
           "gradient_chunks", "greedy_cuts", "hsm_order", "hsm_units",
           "input_roots", "layout", "liveness", "one_level_order", "place", "plan_costs",
           "plan_weight_gradients", "planned_bytes", "policy_named", "private_blobs",
           "recomputable", "schedule", "separate_losses", "time_chunks", "within_budget"]
