"""The house style that CI enforces: ruff (lint and format) over the code, mypy over src/, all with
the settings in pyproject.toml. `bash scripts/style.sh` applies the formatter and ruff's safe fixes;
what they leave is fixed by hand."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "benchmarks", "scripts"]


def tool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m <args>` from the repository root (so pyproject.toml's settings apply)."""
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, input=stdin, capture_output=True, text=True
    )


def passes(result: subprocess.CompletedProcess[str], fix: str) -> None:
    assert result.returncode == 0, (
        f"{' '.join(result.args[2:])} failed ({fix}):\n{result.stdout}{result.stderr}"
    )


def test_ruff_check_passes() -> None:
    passes(
        tool("ruff", "check", *PATHS),
        "bash scripts/style.sh fixes what it can; fix the rest by hand",
    )


def test_ruff_format_is_applied() -> None:
    passes(tool("ruff", "format", "--check", *PATHS), "run bash scripts/style.sh")


def test_mypy_passes_on_src() -> None:
    passes(tool("mypy"), "fix the types; pyproject.toml [tool.mypy] holds the settings")


def test_ruff_settings_catch_long_lines_and_unused_names() -> None:
    """The lint settings can fail: a line over 100 columns, an unused import, an undefined name."""
    source = "import os\n\nVALUE = undefined_name\n" + "# " + "x" * 99 + "\n"
    result = tool(
        "ruff", "check", "--no-cache", "--stdin-filename", "src/fedac/_probe.py", "-", stdin=source
    )
    assert result.returncode == 1
    for code in ("F401", "F821", "E501"):
        assert code in result.stdout, result.stdout


def test_mypy_settings_catch_a_wrong_argument_type(tmp_path: Path) -> None:
    """The type checker's settings can fail: an annotated caller passing a str where fedac's seeding
    takes an int is reported, with pyproject.toml's settings."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent(
            """
            from fedac.seeding import derive_seed

            def caller() -> int:
                return derive_seed("0", "probe")
            """
        )
    )
    result = tool("mypy", "--config-file", str(ROOT / "pyproject.toml"), str(probe))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        'Argument 1 to "derive_seed" has incompatible type "str"; expected "int"' in result.stdout
    )
