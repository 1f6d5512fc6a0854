#!/usr/bin/env bash
# The first thing to run on a machine with a CUDA GPU (from the repository root):
#
#     bash bench/gpu_check.sh
#
# 1. installs what is missing of the `gpu` and `test` extras (CuPy as pinned in
#    pyproject.toml; nothing is fetched when everything is already installed),
# 2. runs the GPU half of the test matrix (`pytest -m gpu`),
# 3. trains the default tagger (T=21, N=32) and an LSTM layer (T=25, N=32, D=100,
#    H=128) on the GPU and prints tokens/s and peak device memory, beside the launch
#    counts of the trace backend for the same step,
# 4. times the same steps eager and with their gradient pass replayed as a CUDA graph
#    (unroll.engine.cuda_graph.StepGraphs; its replay-equals-eager tests ran in stage 2),
#    then the training command's own step (its solver,
#    examples.pos_tagging.train.training_solver, which replays graphs on a GPU) on packed
#    rows of T = 16, 32, 64 and 159, with and without.
# Every stage has its own time limit (100 + 240 + 70 + 80 + 100 s), so the whole script
# prints its figures in under 10 minutes even where a stage hangs.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
status=0

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || status=1

echo "== install (gpu and test extras, as pinned in pyproject.toml)"
mapfile -t reqs < <("$PY" - <<'EOF'
import re
text = open("pyproject.toml").read()
for key in ("dependencies", "gpu"):
    listed = re.search(rf"^{key} = \[(.*?)\]", text, re.M | re.S).group(1)
    print(*re.findall(r'"([^"]+)"', listed), sep="\n")
print("pytest>=8", "hypothesis>=6.100", sep="\n")
EOF
)
timeout 100 "$PY" -m pip install --quiet "${reqs[@]}" || echo "pip could not install ${reqs[*]}"
"$PY" -c "import cupy; print('CuPy', cupy.__version__, 'CUDA runtime',
cupy.cuda.runtime.runtimeGetVersion(), 'devices', cupy.cuda.runtime.getDeviceCount())" \
    || { echo "CuPy is not usable here: stopping"; exit 1; }

echo "== pytest -m gpu"
timeout 240 "$PY" -m pytest -m gpu -q -p no:cacheprovider --durations=5 || status=1

echo "== GPU throughput (tokens/s, peak device memory)"
timeout 70 "$PY" - <<'EOF' || status=1
import time

import cupy

from examples.pos_tagging.workload import tagger_setup
from unroll.train.step_counts import lstm_setup, traced_step

pool = cupy.get_default_memory_pool()
for name, setup in (("default tagger T=21 N=32", tagger_setup),
                    ("LSTM layer T=25 N=32 D=100 H=128", lstm_setup)):
    pool.free_all_blocks()
    model, solver, inputs, tokens = setup("gpu")
    solver.step(3, feed=inputs)  # compiles CuPy's kernels, allocates diffs and history
    cupy.cuda.Device().synchronize()
    steps, start = 20, time.perf_counter()
    solver.step(steps, feed=inputs)
    cupy.cuda.Device().synchronize()
    seconds = time.perf_counter() - start
    launches = sum(c.launches for c in traced_step(setup).values())
    print(f"{name}: {steps * tokens / seconds:,.0f} tokens/s, "
          f"{1e3 * seconds / steps:.1f} ms/step, {launches} launches/step "
          f"({1e6 * seconds / steps / launches:.1f} us/launch), "
          f"peak device memory (CuPy pool) {pool.total_bytes() / 2**20:.0f} MiB")
EOF
echo "== CUDA graphs: ms per training step, eager vs the gradient pass replayed"
timeout 80 "$PY" - <<'EOF' || status=1
import time

import cupy

from examples.pos_tagging.workload import tagger_setup
from unroll.engine.cuda_graph import GraphError, StepGraphs
from unroll.train.step_counts import lstm_setup


def ms_per_step(solver, feed, steps=20):
    solver.step(3, feed=feed)  # compiles, allocates (and, with graphs, captures)
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    solver.step(steps, feed=feed)
    cupy.cuda.Device().synchronize()
    return 1e3 * (time.perf_counter() - start) / steps


failed = False
for name, setup in (("default tagger T=21 N=32", tagger_setup),
                    ("LSTM layer T=25 N=32 D=100 H=128", lstm_setup)):
    _, solver, feed, _ = setup("gpu")
    eager = ms_per_step(solver, feed)
    model, solver, feed, _ = setup("gpu")
    solver.graphs = StepGraphs(model, warmup=2)
    try:
        graph = ms_per_step(solver, feed)
    except GraphError as error:
        print(f"{name}: eager {eager:.2f} ms/step; graph: {error}")
        failed = True
        continue
    print(f"{name}: eager {eager:.2f} ms/step, graph {graph:.2f} ms/step "
          f"({eager / graph:.1f}x), {solver.graphs.captures} capture(s), "
          f"{solver.graphs.replays} replays")
raise SystemExit(failed)
EOF
echo "== the training command's step (its solver), default tagger, packed rows of N=32"
timeout 100 "$PY" - <<'EOF' || status=1
import time

import cupy

from examples.pos_tagging.train import TrainOptions, training_solver
from examples.pos_tagging.workload import packed_step, packed_tagger
from unroll.engine.cuda_graph import GraphError

failed = False
options = TrainOptions(data=None, model_dir=None)
for T in (16, 32, 64, 159):
    seconds = {}
    for graphs in (False, True):
        tagger, feeds = packed_tagger([T], device="gpu")
        model = tagger.train_model
        solver = training_solver(model, options, steps_per_epoch=1000)
        if solver.graphs is None:
            print(f"T={T}: the training command made no graphs on the GPU")
            failed = True
        if not graphs:
            solver.graphs = None
        batch = feeds[T]()  # one batch, so that the host's batching is not timed
        try:
            for _ in range(3):  # compiles, allocates and, with graphs, captures
                solver.step(1, feed=batch)
            cupy.cuda.Device().synchronize()
            start = time.perf_counter()
            for _ in range(20):
                solver.step(1, feed=batch)
            cupy.cuda.Device().synchronize()
        except GraphError as error:
            print(f"T={T}: graph: {error}")
            failed = True
            break
        seconds[graphs] = (time.perf_counter() - start) / 20
    if len(seconds) == 2:
        launches = {g: packed_step(T, graphs=g, steps=3 if g else 1).launches
                    for g in (False, True)}
        print(f"  T={T:<3} eager {1e3 * seconds[False]:6.2f} ms/step ({launches[False]} "
              f"launches), graphs {1e3 * seconds[True]:6.2f} ms/step ({launches[True]} "
              f"launches): {seconds[False] / seconds[True]:.1f}x, "
              f"{32 * T / seconds[True]:,.0f} tokens/s")
raise SystemExit(failed)
EOF
exit $status
