#!/usr/bin/env bash
# The GPU check of a lent machine (benchmarks/gpu/README.md), run from the repository root of a copy of the
# working tree:
#
#   bash benchmarks/gpu/check.sh                  # set-up, then the sections gsc, kws, profile, tests in that order
#   bash benchmarks/gpu/check.sh tests            # set-up, then only the named sections (SECTIONS="..." too)
#   bash benchmarks/gpu/check.sh setup            # the set-up alone
#   bash benchmarks/gpu/check.sh --dry-run        # the same on the CPU, small: DRY_RUN=1 does the same
#
# Set-up: what the machine is, then what its image lacks, each package on its own from the wheels carried in
# benchmarks/gpu/wheels/, and fedac without dependencies (so the image's CUDA torch stays), PYTHONPATH=src
# where that install fails. Nothing is installed when everything imports already.
# Sections (each bounded by its own timeout; every result is written to $OUT the moment it is measured):
#   gsc       the GSC-scale FedMLAC round, fedac against the plain sequential loop: $OUT/gsc.txt, bench_gsc.json
#   kws       FedKWS-UI's four networks at 100 clients: the hand-written stacked forms against fedac's
#             per-client loop, the bare loop and the vmap path, determinism on and off, tf32 / bf16 with
#             their difference from fp32 (benchmarks/gpu/kws_check.py): $OUT/kws_check.json
#   profile   torch.profiler over one GSC round and one stacked round of each KWS network, top operators
#             by CUDA time: $OUT/profile_*.txt, $OUT/profile.json
#   tests     the CUDA tests, a per-test time limit, modules lacking an optional package skipped: tests.log
#   bench     (not run by default) the other workloads of bench_gpu.py --quick: $OUT/bench_gpu.json
#   variants  (not run by default) the GSC round's variants: chunks of 16, the pure-torch GRU, fedac on the
#             CPU, against fedac in the same process: $OUT/bench_gsc_variants.json
# It exits 0 when every section it ran succeeded, and prints each section's exit code last.
# The dry run scales every section's time limit by benchmarks/gpu/calibrate.py's factor (how much slower this
# machine runs a fixed piece of work than the idle machine the limits were set on; DRY_SCALE overrides it), so
# its verdict does not depend on the machine's load; a hung section still meets a finite limit.
set -euo pipefail

sections=()
for arg in "$@"; do
    [ "$arg" = --dry-run ] && DRY_RUN=1 || sections+=("$arg")
done
[ ${#sections[@]} = 0 ] && read -r -a sections <<<"${SECTIONS:-gsc kws profile tests}"
for section in "${sections[@]}"; do
    case $section in
        setup|gsc|kws|profile|bench|tests|variants) ;;
        *) echo "check.sh: unknown section '$section' (setup gsc kws profile bench tests variants; or --dry-run)" >&2; exit 2 ;;
    esac
done
DRY_RUN=${DRY_RUN:-0}

# Settings (environment). With the set-up, the default sections take at most 9.5 minutes (the device tool's
# limit is 10 a command), about 8 expected: README.md has the budget.
TESTS=${TESTS:-'(device or stacked or resume or packing or residency or supernode or triton) and not killed_mid_run and not live_device and not unregistered'}   # pytest -k (the live Flower federations, CPU-bound, left out)
TESTS_MARK=${TESTS_MARK:-}           # pytest -m expression, used instead of TESTS when set
TEST_FILES=${TEST_FILES:-}           # test files or node ids (default: pyproject's testpaths)
TEST_EACH=${TEST_EACH:-90}           # seconds one test may run before it fails with its traceback
TEST_TIMEOUT=${TEST_TIMEOUT:-110}    # seconds for the tests section (then SIGINT: tracebacks and the summary)
GSC_TIMEOUT=${GSC_TIMEOUT:-170}      # seconds for the gsc section
KWS_TIMEOUT=${KWS_TIMEOUT:-150}      # seconds for the kws section (KWS_ARGS: each network has --budget 30 s)
KWS_ARGS=${KWS_ARGS:---clients 100 --steps 5 --budget 30}
PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-60}
PROFILE_ARGS=${PROFILE_ARGS:---clients 100 --steps 2 --budget 25}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}  # seconds for the bench section
VARIANTS_TIMEOUT=${VARIANTS_TIMEOUT:-240}
BENCH_ARGS=${BENCH_ARGS:---quick}    # bench_gpu.py's scale arguments for every section
BENCH_ONLY=${BENCH_ONLY:-gru,kws,w2v2,paper,impressions}   # the bench section's workloads, in order (those needing the synthesized stand-in last)
DEVICE=${DEVICE:-cuda}
if [ "$DRY_RUN" = 1 ]; then  # the same order and files on the CPU, at the CPU's quick sizes, a tiny test selection
    DEVICE=cpu
    BENCH_ONLY=${DRY_BENCH_ONLY:-gru}
    TEST_FILES=${DRY_TEST_FILES:-tests/test_bench_gpu.py}
    TESTS=${DRY_TESTS:-guard}
    TESTS_MARK=
    KWS_ARGS=${DRY_KWS_ARGS:---clients 3 --steps 1 --batch 4 --budget 20 --networks dscnn,mhattrnn}
    PROFILE_ARGS=${DRY_PROFILE_ARGS:---clients 3 --steps 1 --batch 4 --budget 20 --networks dscnn --gsc-clients 12}
fi

cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-benchmarks/gpu/wheels}
LOGS=${OUT:-$(mktemp -d)}
mkdir -p "$LOGS"
export OUT=$LOGS PYTHONUNBUFFERED=1
started=$(date +%s)
since() { echo "$(( $(date +%s) - started )) s"; }
declare -A rc=()
SCALE=1
if [ "$DRY_RUN" = 1 ]; then  # the limits below were set on an idle machine: scale them by how slow this one is now
    SCALE=${DRY_SCALE:-$($PY benchmarks/gpu/calibrate.py 2>/dev/null || echo 1)}
    scaled() { $PY -c "import sys; print(int(float(sys.argv[1]) * float(sys.argv[2]) + 0.5))" "$1" "$SCALE"; }
    GSC_TIMEOUT=$(scaled "$GSC_TIMEOUT"); BENCH_TIMEOUT=$(scaled "$BENCH_TIMEOUT"); TEST_TIMEOUT=$(scaled "$TEST_TIMEOUT")
    KWS_TIMEOUT=$(scaled "$KWS_TIMEOUT"); PROFILE_TIMEOUT=$(scaled "$PROFILE_TIMEOUT"); TEST_EACH=$(scaled "$TEST_EACH")
    export BUDGET_SCALE=$SCALE  # kws_check.py's per-network budgets too
fi

echo "== check.sh: sections ${sections[*]}$([ "$DRY_RUN" = 1 ] && echo " (dry run on the CPU; time limits x $SCALE)"); files in $LOGS"
echo "== $($PY -V) ($(command -v "$PY")); $(nproc) CPUs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
$PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU', torch.cuda.is_available())"

echo "== set-up: what the image lacks (pip log: $LOGS/pip.log)"
missing() {  # the pip names of the given import:pip pairs whose module cannot be found
    $PY - "$@" <<'PYEOF'
import importlib.util, sys
print(" ".join(pair.split(":")[1] for pair in sys.argv[1:] if importlib.util.find_spec(pair.split(":")[0]) is None))
PYEOF
}
install() {  # PACKAGE [pip options]: one package from the carried wheels, on its own, so a failure stops only it
    local package=$1
    shift
    if [ ! -d "$WHEELS" ]; then
        echo "  $package: missing, and no $WHEELS to install it from (benchmarks/gpu/README.md, section 1)"
        return 1
    fi
    if $PY -m pip install --no-index --find-links "$WHEELS" "$@" "$package" >>"$LOGS/pip.log" 2>&1; then
        echo "  installed $package"
    else
        echo "  could not install $package from $WHEELS; the end of pip.log:"
        tail -4 "$LOGS/pip.log" | sed 's/^/    /'
        return 1
    fi
}
for package in $(missing soundfile:soundfile espeakng_loader:espeakng-loader jiwer:jiwer); do
    install "$package" || true
done
# opacus without its dependencies but opt-einsum: the others are torch, numpy and scipy, the image's
for package in $(missing opt_einsum:opt-einsum); do install "$package" || true; done
[ -n "$(missing opacus:opacus)" ] && { install opacus --no-deps || true; }
if [ -n "$(missing flwr:flwr)" ] && ls "$WHEELS"/flwr-*.whl >/dev/null 2>&1; then
    # flwr without uv (only its own dependency installs use it), then the rest of what it requires
    if install flwr --no-deps; then
        needs=$($PY -c "import re; from importlib.metadata import requires; print(' '.join(r.split(';')[0].replace(' ', '') for r in requires('flwr') if 'extra ==' not in r and re.split(r'[<>=!~ \[;]', r)[0] != 'uv'))")
        for need in $needs; do install "$need" || true; done
        $PY -c "import flwr.app, flwr.serverapp" 2>/dev/null \
            || { echo "  flwr does not import: uninstalled, its tests skip"; $PY -m pip uninstall -y flwr >>"$LOGS/pip.log" 2>&1; }
    fi
fi
# fedac itself, unless this tree's src/fedac already imports (an editable install of this checkout)
here=$($PY -c "import importlib.util, os; s = importlib.util.find_spec('fedac'); print(os.path.realpath(s.origin) if s else '')")
if [ "$here" = "$(realpath src/fedac/__init__.py)" ]; then
    echo "  fedac: this checkout's src/ already imports"
elif $PY -m pip install --no-index --no-deps --no-build-isolation -e . >>"$LOGS/pip.log" 2>&1; then
    echo "  installed fedac (editable)"
else  # setuptools < 77 cannot read pyproject's `license = "..."`; the tests and benchmarks need no install
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    echo "  pip install -e . failed (the end of pip.log below): using PYTHONPATH=src (no \`fedac\` command)"
    tail -3 "$LOGS/pip.log" | sed 's/^/    /'
fi
still=$(missing soundfile:soundfile espeakng_loader:espeakng-loader jiwer:jiwer opacus:opacus flwr:flwr fedac:fedac)
echo "still missing: ${still:-nothing} ($(since) so far)"
[ -s "$LOGS/pip.log" ] || rm -f "$LOGS/pip.log"

run_section() {  # NAME TIMEOUT COMMAND...: under `timeout` (SIGINT first, KILL 10 s later), output teed to NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(since) after the start; at most $limit s): $*"
    set +e
    timeout -s INT -k 10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
    rc[$name]=${PIPESTATUS[0]}
    set -e
    echo "== $name: exit code ${rc[$name]} ($(since) after the start)"
}
bench=("$PY" benchmarks/bench_gpu.py $BENCH_ARGS --device "$DEVICE")
for section in "${sections[@]}"; do
    case $section in
        setup) rc[setup]=0 ;;
        gsc)
            rm -f "$LOGS/gsc.txt"
            run_section gsc "$GSC_TIMEOUT" "${bench[@]}" --only gsc --paths fedac,plain \
                --out "$LOGS/bench_gsc.json" --summary "$LOGS/gsc.txt"
            echo "== GSC: $(cat "$LOGS/gsc.txt" 2>/dev/null || echo 'no GSC number (see gsc.log)')" ;;
        kws)
            run_section kws "$KWS_TIMEOUT" "$PY" benchmarks/gpu/kws_check.py --device "$DEVICE" $KWS_ARGS \
                --out "$LOGS/kws_check.json" ;;
        profile)
            run_section profile "$PROFILE_TIMEOUT" "$PY" benchmarks/gpu/kws_check.py --profile --device "$DEVICE" \
                $PROFILE_ARGS --out-dir "$LOGS" ;;
        bench)
            run_section bench "$BENCH_TIMEOUT" "${bench[@]}" --only "$BENCH_ONLY" --out "$LOGS/bench_gpu.json" ;;
        variants)
            run_section variants "$VARIANTS_TIMEOUT" "${bench[@]}" --only gsc \
                --paths fedac,fedac_chunk16,fedac_gru_torch,fedac_cpu --out "$LOGS/bench_gsc_variants.json" ;;
        tests)
            [ -n "$(missing soundfile:soundfile)" ] && echo "soundfile is missing: tests/conftest.py imports it, so no test runs"
            select=(-k "$TESTS")
            [ -n "$TESTS_MARK" ] && select=(-m "$TESTS_MARK")
            # pytest_guard.py: a test past TEST_EACH fails with its traceback (one stuck in C code: faulthandler
            # dumps every thread 10 s later, when the alarm could not interrupt it), modules lacking an optional
            # package skip (listed at the end and in tests_skipped.txt), SIGINT prints the summary. -v: one line a
            # test as it ends, so a section killed at its limit still says which tests failed (on the H200, -q's
            # row of dots showed two failures and not their names)
            FEDAC_TEST_DEVICE=$DEVICE run_section tests "$TEST_TIMEOUT" "$PY" -X faulthandler benchmarks/gpu/pytest_guard.py \
                -v -rf --tb=short -p no:cacheprovider --continue-on-collection-errors -o faulthandler_timeout=$((TEST_EACH + 10)) \
                --test-timeout "$TEST_EACH" --skipped-file "$LOGS/tests_skipped.txt" "${select[@]}" $TEST_FILES ;;
    esac
done
codes=""
ok=1
for section in "${sections[@]}"; do
    codes+="$section ${rc[$section]}, "
    [ "${rc[$section]}" = 0 ] || ok=0
done
echo "exit codes: ${codes%, } ($(since) in all; files in $LOGS)"
[ -f "$LOGS/gsc.txt" ] && echo "GSC: $(cat "$LOGS/gsc.txt")"
[ "$ok" = 1 ]
