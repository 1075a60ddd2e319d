#!/usr/bin/env bash
# Apply the house style (pyproject.toml [tool.ruff]) to the tree: ruff's formatter, then ruff's safe
# fixes (import order, pyupgrade, unused imports), then the formatter again for what the fixes moved.
# What is left is for hand fixing: `bash scripts/style.sh --check` runs the read-only checks that
# tests/test_style.py runs (ruff check, ruff format --check, mypy).
set -euo pipefail
cd "$(dirname "$0")/.."
PATHS=(src tests benchmarks scripts)
RUFF=(.venv/bin/python -m ruff)
if [ "${1:-}" = "--check" ]; then
    status=0
    "${RUFF[@]}" check "${PATHS[@]}" || status=1
    "${RUFF[@]}" format --check "${PATHS[@]}" || status=1
    .venv/bin/python -m mypy || status=1
    exit "$status"
fi
"${RUFF[@]}" format "${PATHS[@]}"
"${RUFF[@]}" check --fix --exit-zero "${PATHS[@]}"
"${RUFF[@]}" format "${PATHS[@]}"
