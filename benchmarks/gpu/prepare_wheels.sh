#!/usr/bin/env bash
# Fill benchmarks/gpu/wheels/ (git-ignored) with the wheels that check.sh installs on a lent GPU machine, which
# reaches no package registry. Run here, from anywhere in the checkout (it needs the registry, once):
#
#   benchmarks/gpu/prepare_wheels.sh              # fedac's dependencies the GPU image lacks, for Python 3.12
#   benchmarks/gpu/prepare_wheels.sh 3.11         # for another Python (check.sh prints the machine's `python -V`)
#   FLOWER=1 benchmarks/gpu/prepare_wheels.sh     # also flwr and what it needs (about 27 MB more; see README.md)
#
# Versions are this checkout's .venv's, so the GPU machine runs what the tests here ran.
set -euo pipefail
PYV=${1:-3.12}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W="$ROOT/benchmarks/gpu/wheels"
PY="$ROOT/.venv/bin/python"
mkdir -p "$W"
PLATFORM=(--only-binary=:all: --python-version "$PYV" --implementation cp --platform any
          --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64)
pin() { "$PY" -c "import sys; from importlib.metadata import version; print(' '.join(f'{p}=={version(p)}' for p in sys.argv[1:]))" "$@"; }

# soundfile (cffi, pycparser), espeakng-loader (the stand-ins' speech), jiwer (rapidfuzz) with their dependencies
"$PY" -m pip download -q "${PLATFORM[@]}" -d "$W" $(pin soundfile espeakng-loader jiwer)
# opacus without its dependencies (torch, numpy, scipy: the GPU image's) but opt-einsum, which images may lack
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$W" $(pin opacus opt-einsum)
if [ "${FLOWER:-0}" = 1 ]; then
    "$PY" -m pip download -q "${PLATFORM[@]}" -d "$W" $(pin flwr)
    rm -f "$W"/uv-*.whl  # 17 MB, used only by Flower's own dependency installs (check.sh installs flwr without it)
fi
# packages the GPU machine's image already holds: not carried (click is: jiwer needs a newer one than some images')
for p in numpy typing_extensions pyyaml PyYAML pygments charset_normalizer urllib3 certifi idna anyio h11 \
         markupsafe MarkupSafe mdurl markdown_it_py shellingham annotated_doc uvloop; do
    rm -f "$W/$p"-[0-9]*.whl
done
ls -s "$W"
du -sh "$W"
