"""Functions that read in one screen: none in src/ is over MAX_LINES lines, counted from its `def`
line to its last line (decorators excluded). A longer one is split by meaning, into named helpers
that say what they do."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 80


def long_functions(source: str, where: str) -> list[str]:
    """'<where>:<line> <name> (<n> lines)' for each function or method of `source` over
    MAX_LINES lines, nested ones included."""
    return [
        f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]


def test_no_function_in_src_is_over_80_lines() -> None:
    found = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        for hit in long_functions(path.read_text(), str(path.relative_to(SRC.parent)))
    ]
    assert not found, (
        f"functions over {MAX_LINES} lines (split each by meaning into named helpers):\n"
        + "\n".join(found)
    )


def test_the_length_check_names_a_long_function_and_its_length() -> None:
    """The check can fail: an 81-line function (decorator not counted) is named with its length,
    an 80-line one and a long class body are not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    source = (
        "@decorator\ndef long_one():\n"
        + body
        + "    return 0\n\n"
        + "def fits():\n"
        + body[: -len("    x78 = 78\n")]
        + "    return 0\n\n"
        + "class Big:\n"
        + body
        + body
    )
    assert long_functions(source, "probe.py") == ["probe.py:2 long_one (81 lines)"]
