"""The README serves a newcomer: at most 250 lines; its first screen links the plug-in guide; right
after the Quick start's commands, what the default job does, how long it took on which CPU and what
it reached, in a few lines, then the run directory; the suite's skip count is said to depend on the
machine."""

from __future__ import annotations

from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
SCREEN = 40  # lines of one terminal screen


def test_the_readme_is_at_most_250_lines():
    assert len(README) <= 250


def test_the_first_screen_links_the_plugin_guide():
    assert any("](docs/extending.md)" in line for line in README[:SCREEN])


def test_the_second_screen_says_what_the_default_job_does_then_shows_the_run_directory():
    commands_end = next(
        k
        for k, line in enumerate(README)
        if line.startswith("bash scripts/setup.sh && .venv/bin/python")
    )
    start = README.index("```", commands_end) + 2  # (after the code block and a blank line)
    paragraph = README[start : README.index("", start)]
    assert len(paragraph) <= 5, paragraph
    text = " ".join(paragraph)
    for what in ("50 rounds", "took 62 s", "Intel Xeon with AVX-512", "test accuracy"):
        assert what in text, what
    assert "docs/results/default-run/" in text  # where the portability details went
    assert README.index("runs/<time>-fedavg-speech_commands-s0/") < SCREEN + 5


def test_the_skip_count_is_said_to_depend_on_the_machine():
    text = " ".join(README)
    assert "How many tests skip depends on the machine" in text
