#!/usr/bin/env bash
# The GPU check of a lent machine (benchmarks/gpu/README.md), run from the repository root of a copy of the
# working tree: installs what the machine's image lacks from the wheels carried in benchmarks/gpu/wheels/,
# fedac itself without dependencies (so the image's CUDA torch stays), runs the CUDA tests, then the quick
# GPU benchmark, whose table comes last. Logs and bench_gpu.json go to $OUT (a temporary folder if unset).
# About 8 minutes on one H100, most of it the tests.
set -euo pipefail

TESTS='(device or stacked or resume or packing or residency or supernode or triton) and not killed_mid_run and not live_device and not unregistered'   # the CUDA test selection (pytest -k; the live Flower federations, CPU-bound, left out)
TESTS_MARK=${TESTS_MARK:-}            # pytest -m expression, used instead of TESTS when set
TEST_TIMEOUT=${TEST_TIMEOUT:-240}     # seconds for the tests, so the benchmark always gets its turn
BENCH_TIMEOUT=${BENCH_TIMEOUT:-330}   # seconds for the benchmark (its JSON is written after every workload)
BENCH_ARGS=${BENCH_ARGS:---quick}     # e.g. BENCH_ARGS="--quick --only gsc,kws"

cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=benchmarks/gpu/wheels
LOGS=${OUT:-$(mktemp -d)}
export OUT=$LOGS PYTHONUNBUFFERED=1
started=$(date +%s)
echo "== $($PY -V) ($(command -v "$PY")); $(nproc) CPUs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi: none"
$PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU', torch.cuda.is_available())"

echo "== installing what the image lacks (pip log: $LOGS/pip.log)"
missing() {  # the pip names of the given import:pip pairs whose module cannot be found
    $PY - "$@" <<'PYEOF'
import importlib.util, sys
print(" ".join(pair.split(":")[1] for pair in sys.argv[1:] if importlib.util.find_spec(pair.split(":")[0]) is None))
PYEOF
}
core=$(missing soundfile:soundfile espeakng_loader:espeakng-loader jiwer:jiwer)
if [ -n "$core" ]; then
    $PY -m pip install --no-index --find-links "$WHEELS" $core >>"$LOGS/pip.log" 2>&1 \
        || { echo "could not install $core from $WHEELS (prepare it: benchmarks/gpu/README.md)"; tail -5 "$LOGS/pip.log"; }
fi
if [ -n "$(missing opacus:opacus)" ]; then  # --no-deps: its dependencies (torch above all) are the image's
    $PY -m pip install --no-index --no-deps --find-links "$WHEELS" opacus >>"$LOGS/pip.log" 2>&1 \
        || echo "could not install opacus from $WHEELS"
fi
if [ -n "$(missing flwr:flwr)" ] && ls "$WHEELS"/flwr-*.whl >/dev/null 2>&1; then
    # flwr without uv (only its own dependency installs use it), then the rest of what it requires
    $PY -m pip install --no-index --no-deps --find-links "$WHEELS" flwr >>"$LOGS/pip.log" 2>&1
    needs=$($PY -c "import re; from importlib.metadata import requires; print(' '.join(r.split(';')[0].replace(' ', '') for r in requires('flwr') if 'extra ==' not in r and re.split(r'[<>=!~ \[;]', r)[0] != 'uv'))")
    $PY -m pip install --no-index --find-links "$WHEELS" $needs >>"$LOGS/pip.log" 2>&1 \
        || { echo "flwr's dependencies did not install: Flower tests are left out"; tail -3 "$LOGS/pip.log";
             $PY -m pip uninstall -y flwr >>"$LOGS/pip.log" 2>&1; }
fi
$PY -m pip install --no-index --no-deps --no-build-isolation -e . >>"$LOGS/pip.log" 2>&1 \
    || { echo "pip install -e . failed"; tail -5 "$LOGS/pip.log"; }
still=$(missing soundfile:soundfile espeakng_loader:espeakng-loader jiwer:jiwer opacus:opacus flwr:flwr fedac:fedac)
echo "still missing: ${still:-nothing}"

echo "== CUDA tests"
select=(-k "$TESTS")
[ -n "$TESTS_MARK" ] && select=(-m "$TESTS_MARK")
# without flwr, Flower's test modules skip or fail to import; the others still run
set +e
FEDAC_TEST_DEVICE=cuda timeout "$TEST_TIMEOUT" $PY -m pytest -q -p no:cacheprovider --continue-on-collection-errors "${select[@]}" 2>&1 | tee "$LOGS/tests.log"
tests_rc=${PIPESTATUS[0]}
set -e
echo "tests exit code $tests_rc ($(( $(date +%s) - started )) s so far)"

echo "== benchmark: bench_gpu.py $BENCH_ARGS --device cuda"
set +e
timeout "$BENCH_TIMEOUT" $PY benchmarks/bench_gpu.py $BENCH_ARGS --device cuda 2>&1 | tee "$LOGS/bench.log"
bench_rc=${PIPESTATUS[0]}
set -e
echo "exit codes: tests $tests_rc, bench $bench_rc ($(( $(date +%s) - started )) s in all; logs in $LOGS)"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
