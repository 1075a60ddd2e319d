"""Differential privacy (fedac/rules/privacy.py, issue 13): the accountant against opacus' published
value, clipping and noise on toy uploads, and a DP run from the CLI reporting epsilon at delta =
1e-5."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from fedac.algorithms import algorithm_class
from fedac.cli import main
from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.rules.privacy import Privacy, epsilon
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


def test_accountant_matches_the_published_value():
    # opacus' own accountant test (opacus/tests/accountants_test.py): z = 1.5, q = 0.04, 2250 steps,
    # delta 1e-5.
    assert epsilon(1.5, 0.04, int(90 / 0.04), 1e-5) == pytest.approx(7.32911117143, abs=1e-9)
    assert epsilon(1.5, 0.04, 0, 1e-5) == 0.0
    assert epsilon(0.0, 0.04, 3, 1e-5) == float("inf")
    # composition grows with rounds
    assert epsilon(1.0, 0.1, 10, 1e-5) < epsilon(1.0, 0.1, 20, 1e-5)


def privacy(mode, *sets, clients=10, cohort=4):
    cfg = load_config(
        overrides=[f"dp.mode={mode}", "dp.clip=1.0", "dp.noise_multiplier=2.0", *sets]
    )
    cls = algorithm_class(cfg.algorithm)
    return Privacy(cfg, clients, cohort, cls.dp_compatible, cls.lpa_setting)


REFERENCE = {"w": torch.zeros(2), "n": torch.tensor(3)}
UPLOADS = [
    ({"w": torch.tensor([3.0, 4.0]), "n": torch.tensor(3)}, 50),
    ({"w": torch.tensor([0.3, 0.4]), "n": torch.tensor(3)}, 7),
]


def test_central_clips_every_update_and_unweights():
    out = privacy("central").clip(REFERENCE, ["a", "b"], UPLOADS, malicious={"a"})
    assert torch.allclose(out[0][0]["w"], torch.tensor([0.6, 0.8])) and torch.allclose(
        out[1][0]["w"], torch.tensor([0.3, 0.4])
    )
    assert [n for _, n in out] == [1, 1]


def test_client_mode_attackers_skip_their_own_clipping():
    out = privacy("client").clip(REFERENCE, ["a", "b"], UPLOADS, malicious={"a"})
    assert torch.equal(out[0][0]["w"], torch.tensor([3.0, 4.0]))
    assert privacy("none").clip(REFERENCE, ["a", "b"], UPLOADS) is UPLOADS


class KeepsWeights:
    """An algorithm whose global state keeps its model under another key: DP reaches the model
    through the algorithm's accessors, never by a key of its own."""

    def global_params(self, server):
        return server["weights"]

    def with_global_params(self, server, params):
        return {**server, "weights": params}


def test_server_noise_has_std_z_c_over_m_and_is_seeded():
    dp, owner = privacy("central"), KeepsWeights()
    server = {"weights": {"w": torch.zeros(40000), "n": torch.tensor(3)}, "round": 1}
    noisy, metrics = dp.add_noise(owner, server, round_idx=3, cohort=4)
    assert float(noisy["weights"]["w"].std()) == pytest.approx(2.0 * 1.0 / 4, rel=0.03)
    assert int(noisy["weights"]["n"]) == 3 and noisy["round"] == 1
    assert torch.equal(noisy["weights"]["w"], dp.add_noise(owner, server, 3, 4)[0]["weights"]["w"])
    assert not torch.equal(
        noisy["weights"]["w"], dp.add_noise(owner, server, 4, 4)[0]["weights"]["w"]
    )
    assert metrics["dp_epsilon"] == pytest.approx(epsilon(2.0, 0.4, 3, 1e-5))


@pytest.mark.parametrize(
    "sets, words",
    [
        (["algorithm=fedadam"], "algorithm fedadam transforms"),
        (["aggregation.method=median"], "set aggregation.method=mean"),
        (["algorithm=fedmlac"], "and fedmlac.lpa=false"),
        (["dp.mode=local"], "unknown dp.mode 'local'"),
        (["dp.clip=0"], "dp.clip must be > 0"),
    ],
)
def test_unaccountable_settings_are_refused(sets, words):
    with pytest.raises(ConfigError, match=words):
        privacy("central", *sets)


@pytest.mark.slow
def test_dp_run_reports_epsilon_each_round_and_at_the_end(gsc_root, tmp_path):
    out = tmp_path / "dp"
    flags = [f"--set={k}={v}" for k, v in tiny_run(gsc_root, None).items()]
    assert (
        main(
            [
                "run",
                "--rounds",
                "2",
                "--quiet",
                *flags,
                "--set=train.local_epochs=1",
                "--set=dp.mode=central",
                "--set=dp.noise_multiplier=1.1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    final = json.loads((out / "results.json").read_text())["final"]
    q = 3 / 6  # 6 training speakers, fraction 0.5
    assert final["dp_delta"] == 1e-5 and final["dp_epsilon"] == pytest.approx(
        epsilon(1.1, q, 2, 1e-5)
    )
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [float(r["dp_epsilon"]) for r in rows] == pytest.approx(
        [epsilon(1.1, q, r, 1e-5) for r in (1, 2)]
    )


def test_the_lpa_refusal_follows_the_capability_not_the_algorithm_name():
    """privacy.py reads the algorithm's `lpa_setting` capability (given by the engine), never its
    name."""
    cfg = load_config(
        overrides=["dp.mode=central", "dp.clip=1.0", "algorithm=fedavg", "fedmlac.lpa=true"]
    )
    Privacy(cfg, 10, 4, True)  # fedavg has no LPA switch: accepted
    with pytest.raises(ConfigError, match="and fedmlac.lpa=false"):
        Privacy(cfg, 10, 4, True, "fedmlac.lpa")  # a class whose LPA that setting turns on: refused
    mlac = load_config(
        overrides=["dp.mode=central", "dp.clip=1.0", "algorithm=fedmlac", "fedmlac.lpa=false"]
    )
    privacy_on = Privacy(mlac, 10, 4, True, algorithm_class("fedmlac").lpa_setting)
    assert privacy_on.on and algorithm_class("fedmlac").lpa_setting == "fedmlac.lpa"
