#!/usr/bin/env bash
# Remakes docs/results/default-run/, which README.md quotes: the default `fedac run` (no settings) from an
# empty cache (synthetic data, features, 50 FedAvg rounds), timed. Writes its results.json (with the
# code_version that `fedac report --fresh` checks) and run.json (command, commit, host, elapsed_seconds).
#
#   scripts/default_run.sh                          # then: fedac report, update README.md, commit both
#   DEST=/tmp/try scripts/default_run.sh --rounds 1 # a quick try elsewhere: extra arguments go to `fedac run`
#
# HOST_NOTE="shared with other jobs" adds words to run.json's host.
set -euo pipefail
cd "$(dirname "$0")/.."
fedac=${FEDAC:-.venv/bin/fedac}
python=${PYTHON:-.venv/bin/python}
dest=${DEST:-docs/results/default-run}
if [[ $# -gt 0 && -z ${DEST:-} ]]; then
    echo "default_run.sh: arguments ($*) change the run; set DEST to another folder than $dest" >&2
    exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/home"
start=$(date +%s.%N)
FEDAC_HOME="$work/home" "$fedac" run --out "$work/run" "$@"
end=$(date +%s.%N)
mkdir -p "$dest"
cp "$work/run/results.json" "$dest/results.json"
"$python" - "$dest/run.json" "$start" "$end" "$*" <<'EOF'
import json, os, subprocess, sys

import torch

path, start, end, extra = sys.argv[1:]
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
note = os.environ.get("HOST_NOTE")
record = {
    "command": "FEDAC_HOME=$(mktemp -d) fedac run --out <dir>" + (f" {extra}" if extra else ""),
    "script": "scripts/default_run.sh",
    "note": "the default `fedac run` (no settings) from an empty cache: synthetic data generation, features, "
            "50 FedAvg rounds; results.json is the run's own, copied from <dir>",
    "commit": commit,
    "host": f"{os.cpu_count()} CPUs{', ' + note if note else ''}, torch {torch.__version__}",
    "elapsed_seconds": round(float(end) - float(start), 1),
}
with open(path, "w") as handle:
    handle.write(json.dumps(record, indent=2) + "\n")
EOF
echo "wrote $dest/results.json and $dest/run.json; now \`fedac report\` shows the new figures for README.md," \
     "and \`fedac report --check --fresh\` passes once README.md quotes them"
