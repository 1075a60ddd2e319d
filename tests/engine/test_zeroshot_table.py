"""The zero-shot run's closing table: after rounds that registered no new class the registration
figures say so instead of printing a bare nan."""

from __future__ import annotations

import math

from fedac.engine.zeroshot import NONE_YET, zeroshot_table


def final(**registration) -> dict:
    return {
        "dataset": "speech_commands",
        "rounds": 2,
        "wall_seconds": 3.0,
        "final": {
            "scenario": "table3",
            **dict.fromkeys(
                ("local_acc", "global_acc", "increase", "final_local_acc", "final_global_acc"), 0.5
            ),
            **dict.fromkeys(("accuracy", "macro_f1", "accuracy_old", "accuracy_new"), 0.25),
            "labels": 8,
            "di_seconds": 0.0,
            **registration,
        },
    }


def test_no_registration_yet_reads_as_such_not_nan():
    nothing = {"ari": math.nan, "registration_correct": math.nan, "di_seconds_per_class": math.nan}
    for registration in (nothing, dict.fromkeys(nothing)):  # in memory, or read back as null
        table = zeroshot_table(final(**registration))
        assert "nan" not in table
        lines = table.splitlines()
        assert any(line.startswith("registration") and line.endswith(NONE_YET) for line in lines)
        assert any(line.endswith(f"0.0 s; per class: {NONE_YET}") for line in lines)
    table = zeroshot_table(final(ari=0.5, registration_correct=0.75, di_seconds_per_class=2.0))
    assert "0.500 / 75.00%" in table and "per class: 2.0 s" in table
