"""Reflow the lines over the house limit (pyproject.toml [tool.ruff] line-length) that ruff's
formatter leaves: comments, docstrings and single-line string literals. scripts/style.sh runs it
after the formatter (and, with --trailing-comments, before it); `python scripts/reflow.py
[--trailing-comments] [PATH...]` runs it alone.

Each fix moves words, never changes them:
- a comment or docstring line pushes its last words onto the next line of the same paragraph (or a
  new line, when the paragraph ends there); tables and examples (aligned columns) are left alone;
- a trailing comment that does not fit moves onto its own line above the code;
- a string literal splits at a space into adjacent literals (Python joins them back), wrapped in
  parentheses where it is not already inside brackets.
A file is written only if its syntax tree is unchanged (docstrings up to whitespace) and its
comments hold the same words in the same order; otherwise it is left as it was and named. Lines that
no rule can shorten are listed at the end, for hand work. Needs Python 3.10 or 3.11: from 3.12 on,
f-strings tokenize as parts, and they are then left alone.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST_ITEM = re.compile(r"(?:[-*+] |\d+[.)] |>>> |\.\.\. |:\w)")
ALIGNED = re.compile(r"\S {2,}\S")  # two or more inner spaces: a table, an aligned example
RULER = re.compile(r"^(\s*#.*?\S) ?([-=#~*]{4,})$")  # "# --- title ------" section rulers


def line_limit() -> int:
    """[tool.ruff] line-length (read by pattern: tomllib is 3.11+ and this runs on 3.10 too)."""
    found = re.search(r"^line-length\s*=\s*(\d+)", (ROOT / "pyproject.toml").read_text(), re.M)
    if found is None:
        raise SystemExit("scripts/reflow.py: pyproject.toml has no [tool.ruff] line-length")
    return int(found.group(1))


@dataclass
class Source:
    """A file's lines with what tokenize and ast say about them."""

    lines: list[str]  # each with its newline
    tokens: list[tokenize.TokenInfo]
    docstrings: set[int]  # the (1-based) lines inside string statements: docstrings, field docs
    depth: dict[tuple[int, int], int]  # bracket depth at each token's start

    @classmethod
    def parse(cls, text: str) -> Source:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        docstrings: set[int] = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                if isinstance(node.value.value, str) and node.end_lineno is not None:
                    docstrings.update(range(node.lineno, node.end_lineno + 1))
        depth, level = {}, 0
        for tok in tokens:
            depth[tok.start] = level
            if tok.type == tokenize.OP and tok.string in "([{":
                level += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                level -= 1
        return cls(text.splitlines(keepends=True), tokens, docstrings, depth)


def width(line: str) -> int:
    return len(line.rstrip("\r\n"))


def break_at(text: str, limit: int, start: int) -> int | None:
    """The index of the last space in text[start:limit + 1] that leaves words on both sides."""
    cut = text.rfind(" ", start, limit + 1)
    while cut > start and text[cut - 1] == " ":
        cut -= 1
    if cut <= start or not text[start:cut].strip() or not text[cut:].strip():
        return None
    return cut


def push_words(
    lines: list[str], i: int, start: int, follow: str, limit: int, join: bool = True
) -> bool:
    """Line i is too long and its text begins at column `start`: its last words go to the front of
    line i+1 when that line continues the paragraph (`join`, and it is `follow` and a word that
    opens no list item), else onto a new line `follow + words`."""
    line = lines[i].rstrip("\r\n")
    newline = lines[i][len(line) :] or "\n"
    if ALIGNED.search(line[start:]):
        return False
    cut = break_at(line, limit, start)
    if cut is None:
        return False
    head, tail = line[:cut].rstrip(), line[cut:].strip()
    same = re.compile(re.escape(follow) + r"(?!" + LIST_ITEM.pattern + r"|\"\"\"|''')\S.*")
    nxt = lines[i + 1].rstrip("\r\n") if i + 1 < len(lines) else ""
    lines[i] = head + newline
    if join and same.fullmatch(nxt) and not ALIGNED.search(nxt[len(follow) :]):
        lines[i + 1] = follow + tail + " " + nxt[len(follow) :] + lines[i + 1][len(nxt) :]
    else:
        lines.insert(i + 1, follow + tail + newline)
    return True


def item_indent(text: str) -> str:
    """The extra indent of a list item's continuation lines ("- " -> two spaces)."""
    item = LIST_ITEM.match(text)
    return " " * len(item.group(0)) if item and item.group(0)[0] in "-*+0123456789" else ""


def fix_comment(src: Source, tok: tokenize.TokenInfo, limit: int) -> bool:
    row, col = tok.start
    i = row - 1
    line = src.lines[i]
    if re.search(r"#\s*(noqa|type:|pragma|fmt:)", tok.string):
        return False
    if line[:col].strip():  # trailing comment: onto its own line above, at the line's indent
        code = line[:col].rstrip()
        if len(code) > limit or (i and src.lines[i - 1].rstrip().endswith("\\")):
            return False
        indent = line[: len(line) - len(line.lstrip())]
        src.lines[i : i + 1] = [indent + tok.string + "\n", code + "\n"]
        return True
    ruler = RULER.match(line.rstrip("\r\n"))
    if ruler:
        title = ruler.group(1) + " "
        if len(title) + 4 > limit:
            return False
        src.lines[i] = title + ruler.group(2)[0] * (limit - len(title)) + "\n"
        return True
    prefix = re.match(r"\s*#:? *", line).group(0)  # type: ignore[union-attr]
    return push_words(src.lines, i, len(prefix), prefix + item_indent(line[len(prefix) :]), limit)


def fix_docstring(src: Source, i: int, limit: int) -> bool:
    """A docstring line; on its first line the words after the quotes continue at their indent."""
    line = src.lines[i].rstrip("\r\n")
    closes = line.rstrip().endswith(('"""', "'''")) and len(line.strip()) > 3
    indent = line[: len(line) - len(line.lstrip())]
    quote = re.match(r'\s*[rRuU]?("""|\'\'\')', line)
    start = len(quote.group(0)) if quote else len(indent)
    return push_words(src.lines, i, start, indent + item_indent(line[start:]), limit, not closes)


def split_literal(tok: tokenize.TokenInfo, room: int) -> list[str] | None:
    """A one-line string literal as adjacent literals, the first at most `room` wide, each later one
    as long as fits; None where it has no usable space."""
    match = re.match(r"(?i)([rbuf]*)(['\"])(.*)\2$", tok.string, re.S)
    if not match or tok.string.endswith(('"""', "'''")):
        return None
    prefix, quote, body = match.groups()
    fstring = "f" in prefix.lower()
    spaces, level, skip = [], 0, False
    for k, ch in enumerate(body):  # spaces outside f-string replacement fields
        if skip:
            skip = False
        elif fstring and body[k : k + 2] in ("{{", "}}"):
            skip = True
        elif fstring and ch == "{":
            level += 1
        elif fstring and ch == "}":
            level -= 1
        elif ch == " " and level == 0 and 0 < k < len(body) - 1 and body[k - 1] != "\\":
            spaces.append(k)
    fits = [k for k in spaces if len(prefix) + k + 3 <= room]
    if not fits:
        return None
    cut = fits[-1] + 1
    return [literal(prefix, quote, body[:cut]), literal(prefix, quote, body[cut:])]


def literal(prefix: str, quote: str, body: str) -> str:
    """One part of a split literal: an f-string part without a replacement field drops the f (and
    its doubled braces), so that ruff's F541 does not flag it."""
    if "f" in prefix.lower() and "{" not in body.replace("{{", "").replace("}}", ""):
        prefix = re.sub("(?i)f", "", prefix)
        body = body.replace("{{", "{").replace("}}", "}")
    return f"{prefix}{quote}{body}{quote}"


def fix_string(src: Source, index: int, limit: int) -> bool:
    tok = src.tokens[index]
    row, col = tok.start
    i = row - 1
    line = src.lines[i]
    before, after = line[:col], line[tok.end[1] :]
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    # In brackets the parts need no parentheses, except as a dict value or keyword argument, where
    # the formatter would leave the later parts at the keys' indent.
    value = src.tokens[index - 1].type == tokenize.OP and src.tokens[index - 1].string in ":="
    after_tok = next(
        t for t in src.tokens[index + 1 :] if t.type not in (tokenize.NL, tokenize.COMMENT)
    )
    if (
        after_tok.type == tokenize.STRING
    ):  # the value goes on below: parentheses would cut it in two
        value = False
    if src.depth[tok.start] > 0 and not value:
        parts = split_literal(tok, limit - col)
        if parts is None:
            return False
        src.lines[i : i + 1] = [before + parts[0] + "\n", indent + parts[1] + after]
        if not after.strip():  # the literal goes on below: the words join its next part
            join_literals(src, index, i + 1)
        return True
    near = [t for t in (src.tokens[index - 1], src.tokens[index + 1]) if t.start[0] == row]
    if any(t.type == tokenize.STRING for t in near):
        return False  # an implicit concatenation on one line: parentheses around one part break it
    parts = split_literal(tok, limit - len(indent))
    if parts is None:
        return False
    src.lines[i : i + 1] = [
        before + "(\n",
        indent + parts[0] + "\n",
        indent + parts[1] + "\n",
        indent[4:] + ")" + after.lstrip(" "),
    ]
    return True


def join_literals(src: Source, index: int, i: int) -> None:
    """Line i holds the words split off the literal src.tokens[index]; when the line after it starts
    with the next part of the same implicit concatenation (same quotes and prefix, give or take
    the f), the words move into that part, so a split leaves no stub line (the next pass splits the
    part again if it grew too long)."""
    if index + 2 >= len(src.tokens) or src.tokens[index + 1].type != tokenize.NL:
        return
    follow = src.tokens[index + 2]  # (positions from before the split, which added one line)
    if follow.type != tokenize.STRING or follow.start[0] != follow.end[0]:
        return
    pattern = r"(?i)([rbuf]*)(['\"])(.*)\2$"
    ours = re.match(pattern, src.lines[i].strip())
    theirs = re.match(pattern, follow.string)
    if not ours or not theirs or follow.string.endswith(('"""', "'''")):
        return
    if ours.group(2) != theirs.group(2):
        return
    if ours.group(1).lower().replace("f", "") != theirs.group(1).lower().replace("f", ""):
        return
    fstring = "f" in (ours.group(1) + theirs.group(1)).lower()

    def body(match: re.Match[str]) -> str:
        text = match.group(3)
        return (
            text.replace("{", "{{").replace("}", "}}")
            if fstring and "f" not in match.group(1).lower()
            else text
        )

    prefix = theirs.group(1) if "f" in theirs.group(1).lower() else ours.group(1)
    merged = literal(prefix, ours.group(2), body(ours) + body(theirs))
    row = follow.start[0]
    line = src.lines[row]
    src.lines[row] = line[: follow.start[1]] + merged + line[follow.end[1] :]
    del src.lines[i]


def fix_line(src: Source, row: int, limit: int, trailing_only: bool = False) -> bool:
    """Shorten line `row` (1-based) by one move; False if no rule applies. `trailing_only`: only
    move a trailing comment (before the formatter runs: the code is laid out again without it)."""
    on_line = [k for k, t in enumerate(src.tokens) if t.start[0] <= row <= t.end[0]]
    for k in on_line:
        tok = src.tokens[k]
        if tok.type == tokenize.COMMENT and tok.start[0] == row:
            if trailing_only and not src.lines[row - 1][: tok.start[1]].strip():
                return False
            return fix_comment(src, tok, limit)
    if trailing_only:
        return False
    if row in src.docstrings:
        return fix_docstring(src, row - 1, limit)
    strings = [k for k in on_line if src.tokens[k].type == tokenize.STRING]
    for k in sorted(strings, key=lambda k: -src.tokens[k].end[1]):
        tok = src.tokens[k]
        # (the rightmost literal first; splitting one also moves the code after it to the next line)
        if tok.start[0] == tok.end[0] == row and fix_string(src, k, limit):
            return True
    return False


def comment_words(text: str) -> list[str]:
    words = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            words += [
                w for w in tok.string.lstrip("#:").split() if not re.fullmatch(r"[-=#~*]+", w)
            ]
    return words


def tree(text: str) -> str:
    """The syntax tree, with string statements' whitespace collapsed (docstrings reflow)."""
    parsed = ast.parse(text)
    for node in ast.walk(parsed):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                node.value.value = " ".join(node.value.value.split())
    return ast.dump(parsed)


def reflow(text: str, limit: int, trailing_only: bool = False) -> tuple[str, list[int]]:
    """The text with its long lines shortened where a rule applies, and the lines still too long."""
    src, stuck = Source.parse(text), set()
    for _ in range(20 * len(src.lines) + 100):
        long_rows = [
            n + 1
            for n, line in enumerate(src.lines)
            if width(line) > limit and line.rstrip("\r\n") not in stuck
        ]
        if not long_rows:
            break
        row = long_rows[0]
        before, saved = src.lines[row - 1].rstrip("\r\n"), list(src.lines)
        try:
            fixed = fix_line(src, row, limit, trailing_only)
            if fixed:
                src = Source.parse("".join(src.lines))
        except (SyntaxError, tokenize.TokenError):  # a split the grammar does not allow there
            fixed, src.lines = False, saved
        if not fixed:
            stuck.add(before)
    rows = [n + 1 for n, line in enumerate(src.lines) if width(line) > limit]
    return "".join(src.lines), rows


def main(args: list[str]) -> int:
    trailing_only = "--trailing-comments" in args
    paths = [a for a in args if a != "--trailing-comments"] or [
        "src",
        "tests",
        "benchmarks",
        "scripts",
    ]
    limit, left, refused = line_limit(), 0, []
    files = [
        p
        for arg in paths
        for p in (sorted(Path(arg).rglob("*.py")) if Path(arg).is_dir() else [Path(arg)])
    ]
    for path in files:
        text = path.read_text()
        if not any(width(line) > limit for line in text.splitlines()):
            continue
        new, rows = reflow(text, limit, trailing_only)
        if new != text:
            if tree(new) != tree(text) or comment_words(new) != comment_words(text):
                refused.append(str(path))
                continue
            path.write_text(new)
        if not trailing_only:
            for row in rows:
                print(f"{path}:{row}: still over {limit} columns")
            left += len(rows)
    for path in refused:
        print(f"{path}: left unchanged: the reflow would have changed its code (please report)")
    if not trailing_only:
        print(f"reflow: {left} line(s) over {limit} columns left for hand work", file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
