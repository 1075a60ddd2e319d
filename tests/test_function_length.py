"""Code that reads on its own: no function in src/ is over MAX_LINES lines, counted from its `def`
line to its last line (decorators excluded), and no comment or docstring in src/ points at an issue
number instead of saying why. A longer function is split by meaning, into named helpers that say
what they do; a reader of the code has the code, not the issue tracker."""

from __future__ import annotations

import ast
import io
import re
import tokenize
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


ISSUE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def issue_references(source: str, where: str) -> list[str]:
    """'<where>:<line> <text>' for each comment or docstring of `source` that names an issue
    number ("issue 13", "Issue #13", "issues 13")."""
    texts = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and (
            doc := ast.get_docstring(node, clean=False)
        ):
            texts.append((node.body[0].lineno, doc))
    return [
        f"{where}:{line} {match.group(0)!r}"
        for line, text in sorted(texts)
        for match in ISSUE.finditer(text)
    ]


def test_no_comment_or_docstring_in_src_names_an_issue_number() -> None:
    found = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        for hit in issue_references(path.read_text(), str(path.relative_to(SRC.parent)))
    ]
    assert not found, (
        "comments and docstrings that point at an issue number (say the reason in words):\n"
        + "\n".join(found)
    )


def test_the_issue_check_finds_comments_and_docstrings_but_not_code() -> None:
    """The check can fail: a comment and a function's docstring citing issues are named, a string
    in the code that is no docstring is not."""
    source = (
        '"""Module."""\n\n'
        "x = 1  # see issue 13\n\n\n"
        "def f():\n"
        '    """Why (Issue #7)."""\n'
        '    return "issue 9"\n'
    )
    assert issue_references(source, "probe.py") == [
        "probe.py:3 'issue 13'",
        "probe.py:7 'Issue #7'",
    ]
