"""The house style that CI enforces: ruff (lint and format) over the code, mypy over src/, all with
the settings in pyproject.toml. `bash scripts/style.sh` applies the formatter and ruff's safe fixes;
what they leave is fixed by hand."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


# mypy reads torch's and numpy's types: about 40-80 s on two cores from an empty cache (a clean
# clone), under 2 s once .mypy_cache holds them.
@pytest.mark.slow
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


@pytest.mark.slow
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


def load_reflow():
    """scripts/reflow.py as a module (scripts/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reflow", ROOT / "scripts" / "reflow.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reflow"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_reflow_shortens_comments_docstrings_and_strings_without_changing_the_code() -> None:
    reflow = load_reflow()
    words = " ".join(f"word{i}" for i in range(30))
    source = textwrap.dedent(
        f'''
        def f(value):
            """{words}
            next line of the same paragraph.

            - an item {words}
            """
            # {words}
            # the comment's second line
            x = 1  # {words}
            label = {{"key": "{words}"}}
            return g(f"{{value}} {words} {{{{braces}}}}", label, x)
        '''
    )
    new, left = reflow.reflow(source, 100)
    assert left == []
    assert all(len(line) <= 100 for line in new.splitlines())
    assert reflow.tree(new) == reflow.tree(source)
    assert reflow.comment_words(new) == reflow.comment_words(source)
    lines = new.splitlines()
    # the docstring's paragraph refills into its next line; the list item continues at its text
    assert "    word27 word28 word29 next line of the same paragraph." in lines
    item = next(k for k, line in enumerate(lines) if line.lstrip().startswith("- an item"))
    assert lines[item + 1].startswith("      word13 ")
    # the trailing comment moved above its line, the comment above took its overflow
    assert "    # word28 word29 the comment's second line" in lines
    assert lines[lines.index("    x = 1") - 1] == "    # word28 word29"
    # the literals split into adjacent ones that make the same values
    namespace: dict = {}
    exec(new + "\ndef g(*a):\n    return a\n", namespace)
    assert namespace["f"](7)[0] == f"7 {words} {{braces}}"
    assert namespace["f"](7)[1] == {"key": words}


def test_reflow_leaves_tables_and_unbreakable_lines() -> None:
    reflow = load_reflow()
    table = "# " + "name      meaning " * 6 + "\n"
    url = "# https://example.org/" + "x" * 100 + "\n"
    new, left = reflow.reflow(table + url + "x = 1\n", 100)
    assert new == table + url + "x = 1\n" and left == [1, 2]
