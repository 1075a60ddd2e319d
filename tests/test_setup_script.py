"""scripts/setup.sh (which .ci/run calls) says what it is doing at every step and keeps its install
lines: run here on a copy whose Python is a stub that records its arguments (no network, no pip)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STUB = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls.log"
[ "$1" = "-m" ] && [ "$2" = "venv" ] && mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
exit 0
"""


def test_setup_announces_each_step_and_keeps_its_install_lines(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(0o755)
    runs = [
        subprocess.run(
            ["bash", str(tmp_path / "scripts" / "setup.sh")],
            env={"PATH": "/usr/bin:/bin", "PYTHON": str(stub)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        for _ in range(2)  # a second call: the .venv is there
    ]
    assert [run.returncode for run in runs] == [0, 0], runs[0].stderr
    first, second = (run.stdout.splitlines() for run in runs)
    steps = [line.split(": ", 1)[1] for line in first if line.startswith("setup.sh [")]
    assert steps[0] == f"creating .venv with {stub}"
    assert steps[1].startswith("installing torch==2.13.0") and steps[-1].startswith("done")
    assert len(steps) == 6 and not any("creating .venv" in line for line in second)
    calls = (tmp_path / ".venv" / "bin" / "calls.log").read_text().splitlines()
    pip = "-m pip install --quiet --disable-pip-version-check"
    assert f"{pip} torch==2.13.0" in calls
    assert f"{pip} -e .[test,ssl,peft,hf,tensorboard,mlflow,sweep,export]" in calls
