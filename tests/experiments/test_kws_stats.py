"""`fedac data stats`: FedKWS-UI's Table 1 columns and the Fig. 1 scatter, checked by hand on the
fixture."""

from __future__ import annotations

import pytest

from fedac.cli import main


def test_table1_and_scatter_by_hand(gsc_root, tmp_path, capsys):
    png = tmp_path / "fig" / "fig1.png"
    argv = [
        "data",
        "stats",
        "speech_commands",
        "--root",
        str(gsc_root),
        "--quiet",
        "--set",
        "data.local_holdout=0",
        "--scatter",
        str(png),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # 8 speakers x 35 words x 2 clips; speakers 6 and 7 are the validation and test speakers
    assert "Table 1 (FedKWS-UI): K 6, N 420, avg n_k 70.0, max n_k 70, M 70" in out
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"

    from fedac.config import load_config
    from fedac.data.partition import partition
    from fedac.data.registry import load_manifest
    from fedac.experiments.kws_stats import client_table

    cfg = load_config(overrides=[f"data.root={gsc_root}", "data.local_holdout=0"])
    manifest = load_manifest(cfg, progress=False)
    table = client_table(cfg, manifest, partition(manifest, cfg.data, 0))
    # balanced clients: entropy 1 (to the code's 1e-8), w1 = 70 / 300 (the 35-class cap), r0 = 5
    w1 = 70 / 300
    assert table["entropy"] == pytest.approx([1.0] * 6, abs=1e-6)
    assert table["r"] == pytest.approx([5.0 * 2 * w1 / (w1 + 1)] * 6, abs=1e-6)


def test_scatter_colour_follows_the_alt_settings(gsc_root):
    from fedac.config import load_config
    from fedac.data.partition import partition
    from fedac.data.registry import load_manifest
    from fedac.experiments.kws_stats import client_table

    def r(*overrides):
        cfg = load_config(overrides=[f"data.root={gsc_root}", "data.local_holdout=0", *overrides])
        manifest = load_manifest(cfg, progress=False)
        return client_table(cfg, manifest, partition(manifest, cfg.data, 0))["r"]

    assert r("fedkwsui.r0=10") == pytest.approx(2 * r())
    assert r("fedkwsui.size_cap=70") == pytest.approx([5.0] * 6)  # w1 = 1, entropy 1: rbar = 1
