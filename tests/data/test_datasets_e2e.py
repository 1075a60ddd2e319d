"""Every dataset runs end to end from the CLI on its synthetic stand-in / fixture, with noise and
label errors."""

import json

import pytest

from fedac.cli import main
from fedac.data.synth import emotions, urban
from iemocap_fixture import make_iemocap_tree

FAST = [
    "--quiet",
    "--rounds",
    "2",
    "--set",
    "model.name=crnn_tiny",
    "--set",
    "train.eval_every=1",
    "--set",
    "train.local_epochs=1",
    "--set",
    "train.fraction=0.5",
]


@pytest.fixture(scope="module")
def cremad_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cremad")
    emotions.generate(root, actors=10, seed=0, progress=False, workers=1)
    return root


@pytest.fixture(scope="module")
def urban_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("urban")
    urban.generate(root, recordings=80, seed=0, progress=False, workers=1)
    return root


def _run(tmp_path, dataset, root, *extra):
    out = tmp_path / f"run-{dataset}"
    code = main(
        [
            "run",
            "--dataset",
            dataset,
            "--set",
            f"data.root={root}",
            "--out",
            str(out),
            *FAST,
            *extra,
        ]
    )
    assert code == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_cremad_runs_with_noise_and_label_errors(tmp_path, cremad_root, fedac_home):
    clean = _run(tmp_path / "clean", "cremad", cremad_root)
    before = set((fedac_home / "features").glob("cremad*"))
    noisy = _run(
        tmp_path / "noisy",
        "cremad",
        cremad_root,
        "--set",
        "data.snr_db=20",
        "--set",
        "data.label_error=0.3",
    )
    # noisy audio: its own feature cache
    assert len(set((fedac_home / "features").glob("cremad*")) - before) == 1
    assert (
        clean["num_classes"] == noisy["num_classes"] == 4 and clean["clients"] == noisy["clients"]
    )
    # same clients and cohorts, other features and labels: every round trains on other data
    assert all(
        a["train_loss"] != b["train_loss"] for a, b in zip(clean["history"], noisy["history"])
    )


@pytest.mark.slow
def test_urbansound8k_runs_with_dirichlet_clients(tmp_path, urban_root):
    results = _run(
        tmp_path,
        "urbansound8k",
        urban_root,
        "--set",
        "data.num_clients=5",
        "--set",
        "data.min_client_size=2",
        "--set",
        "data.alpha=1.0",
    )
    assert results["num_classes"] == 10 and results["clients"] == 5


def test_iemocap_runs_on_its_layout(tmp_path):
    root = make_iemocap_tree(tmp_path / "iemocap")
    results = _run(tmp_path, "iemocap", root, "--set", "train.fraction=1.0")
    assert results["num_classes"] == 4 and results["clients"] == 8
