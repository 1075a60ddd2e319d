"""Every package under src/fedac says at its top what belongs in it and what must not (issue 44,
item 6), so that from the folder tree and these docstrings a newcomer can tell where a new part goes
(docs/architecture.md's layer table). Read with `ast`: nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

FEDAC = Path(__file__).resolve().parents[1] / "src" / "fedac"
#: A folder of Python sources is a package; these hold none of their own (build output, package
#: data).
PACKAGES = sorted(
    {
        path.parent
        for path in FEDAC.rglob("*.py")
        if "__pycache__" not in path.parts and "_build" not in path.parts
    }
)
#: Words that say what must stay out ("must not", "never", "no import of ...").
EXCLUDES = re.compile(r"\b(not|never|no|nothing|nor)\b", re.IGNORECASE)


def sentences(text: str) -> list[str]:
    """Sentences of a docstring: a full stop, ? or ! then a space or the end; fragments of 3+ words
    only."""
    text = re.sub(r"\b(e\.g|i\.e|etc|cf)\.", "_", " ".join(text.split()))
    return [part for part in re.split(r"(?<=[.?!])\s+", text) if len(part.split()) >= 3]


def test_packages_are_found():
    names = {path.relative_to(FEDAC).as_posix() for path in PACKAGES}
    assert {
        ".",
        "algorithms",
        "data",
        "data/synth",
        "engine",
        "flower",
        "kernels",
        "models",
        "training",
    } <= names


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.relative_to(FEDAC.parent).as_posix())
def test_a_package_says_what_belongs_in_it_and_what_must_not(package):
    init = package / "__init__.py"
    assert init.is_file(), (
        f"{package} holds Python files but no __init__.py (a namespace package hides its purpose)"
    )
    doc = ast.get_docstring(ast.parse(init.read_text(), str(init)))
    assert doc, f"{init} has no docstring saying what belongs in the package"
    assert len(sentences(doc)) >= 2, (
        f"{init}: say in two sentences or more what belongs here and what must not"
    )
    assert EXCLUDES.search(doc), (
        f"{init}: the docstring must say what must not go in the package (not / never / no)"
    )


def test_the_checks_can_fail():
    assert len(sentences("Datasets in their layouts.")) == 1  # one line, as the packages had before
    assert len(sentences("Round loop, e.g. sampling. No algorithm names here.")) == 2
    assert not EXCLUDES.search("Round loop, client sampling, evaluation, checkpoint/resume.")
