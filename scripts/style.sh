#!/usr/bin/env bash
# Apply the house style (pyproject.toml [tool.ruff]) to the tree: ruff's formatter, ruff's safe fixes
# (import order, pyupgrade, unused imports), scripts/reflow.py for the long lines the formatter
# leaves, and the formatter again for what they moved. What is left is for hand fixing:
# `bash scripts/style.sh --check` runs the read-only checks that tests/test_style.py runs (ruff
# check, ruff format --check, mypy).
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
# Trailing comments that make a line too long go above it first, so the formatter lays the code out
# without them; after the formatter, reflow.py shortens the comments, docstrings and strings it
# leaves long (moving words only; it checks that each file's syntax tree is unchanged).
.venv/bin/python scripts/reflow.py --trailing-comments "${PATHS[@]}"
"${RUFF[@]}" format "${PATHS[@]}"
"${RUFF[@]}" check --fix --exit-zero "${PATHS[@]}"
# Twice: the formatter joins a split literal back where it then fits on a line of its own.
for _ in 1 2; do
    .venv/bin/python scripts/reflow.py "${PATHS[@]}"
    "${RUFF[@]}" format "${PATHS[@]}"
done
# docs/extending.md shows the example plug-in's files verbatim (tests/test_plugins.py): its blocks
# follow the files as formatted.
.venv/bin/python - <<'EOF'
import re
from pathlib import Path

doc, plugin = Path("docs/extending.md"), Path("tests/plugin_example")

def current(block: re.Match) -> str:
    path = plugin / block.group(2).splitlines()[0].removeprefix("# ").removeprefix("tests/plugin_example/")
    return block.group(1) + (path.read_text() if path.is_file() else block.group(2)) + "```"

doc.write_text(re.sub(r"^(```(?:python|toml)\n)(# .*?)^```", current, doc.read_text(), flags=re.S | re.M))
EOF
