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
#    counts of the trace backend for the same step.
# Every stage has its own time limit, so the whole script prints its figures in under
# 10 minutes even where a stage hangs.
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
timeout 240 "$PY" -m pip install --quiet "${reqs[@]}" || echo "pip could not install ${reqs[*]}"
"$PY" -c "import cupy; print('CuPy', cupy.__version__, 'CUDA runtime',
cupy.cuda.runtime.runtimeGetVersion(), 'devices', cupy.cuda.runtime.getDeviceCount())" \
    || { echo "CuPy is not usable here: stopping"; exit 1; }

echo "== pytest -m gpu"
timeout 330 "$PY" -m pytest -m gpu -q -p no:cacheprovider --durations=5 || status=1

echo "== GPU throughput (tokens/s, peak device memory)"
timeout 150 "$PY" - <<'EOF' || status=1
import time

import cupy

from bench.gpu_budget import lstm_setup, tagger_setup, traced_step

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
exit $status
