"""Poisoned clients (fedac/rules/attacks.py, issue 13): each attack's effect on a toy upload or
dataset, the backdoor on real audio features, and runs from the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedac.algorithms.base import ClientData, Task
from fedac.cli import main
from fedac.config import load_config
from fedac.engine.data import FederatedData, build_federated_data
from fedac.errors import ConfigError
from fedac.rules.attacks import (
    Attack,
    add_trigger,
    class_permutation,
    little_z,
    malicious_clients,
    trigger_signal,
)
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


def attack(kind, fraction=0.5, clients=("a", "b", "c", "d"), **settings):
    extra = [f"attack.{k}={v}" for k, v in settings.items()]
    cfg = load_config(overrides=[f"attack.kind={kind}", f"attack.fraction={fraction}", *extra])
    return Attack(cfg, list(clients))


# --- who is malicious -----------------------------------------------------------------------------


def test_malicious_clients_are_a_seeded_fraction():
    names = [f"c{i}" for i in range(20)]
    chosen = malicious_clients(names, 0.3, seed=0)
    assert len(chosen) == 6 and set(chosen) <= set(names)
    assert chosen == malicious_clients(names, 0.3, seed=0)
    assert chosen != malicious_clients(names, 0.3, seed=1)
    assert attack("none", 0.5).malicious == set()
    with pytest.raises(ConfigError, match="attack.fraction must lie in \\[0, 1\\], got 1.5"):
        malicious_clients(names, 1.5, 0)
    with pytest.raises(
        ConfigError, match="unknown attack.kind 'flip'. Registered attacks: none, label_flip"
    ):
        attack("flip")


# --- data poisoning on a toy federation -----------------------------------------------------------


def toy_federation(classes=5) -> FederatedData:
    g = torch.Generator().manual_seed(0)
    clients = [
        ClientData(
            name,
            torch.randn(12, 2, 3, generator=g),
            torch.arange(12) % classes,
            torch.randn(3, 2, 3, generator=g),
            torch.arange(3),
        )
        for name in "abcd"
    ]
    return FederatedData(Task(2, classes, list("abcd")), None, clients, None, None)


def test_label_flip_sends_every_training_label_of_attackers_to_the_target():
    atk = attack("label_flip", target=3)
    data = atk.poison_data(toy_federation())
    for client in data.clients:
        if client.name in atk.malicious:
            assert (client.y == 3).all() and torch.equal(client.holdout_y, torch.arange(3))
        else:
            assert torch.equal(client.y, torch.arange(12) % 5)
    assert len(atk.malicious) == 2
    with pytest.raises(
        ConfigError, match="attack.target must be a class index in \\[0, 5\\), got 7"
    ):
        attack("label_flip", target=7).poison_data(toy_federation())


def test_label_permutation_moves_every_class():
    pi = class_permutation(5, seed=0)
    assert sorted(pi.tolist()) == list(range(5)) and (pi != np.arange(5)).all()
    atk = attack("label_permute")
    data = atk.poison_data(toy_federation())
    bad = next(c for c in data.clients if c.name in atk.malicious)
    assert torch.equal(bad.y, torch.from_numpy(pi)[torch.arange(12) % 5])
    assert torch.equal(bad.x, toy_federation().client(bad.name).x)  # audio untouched


# --- model poisoning on toy uploads ---------------------------------------------------------------

REFERENCE = {"w": torch.zeros(3), "steps": torch.tensor(4)}


def toy_uploads(values=(1.0, 2.0, 3.0, 4.0)):
    return [({"w": torch.full((3,), v), "steps": torch.tensor(4)}, 10) for v in values]


def poisoned(kind, names=("a", "b", "c", "d"), values=(1.0, 2.0, 3.0, 4.0), **settings):
    atk = attack(kind, fraction=0.25, clients=names, **settings)
    out = atk.poison_uploads(REFERENCE, list(names), toy_uploads(values), round_idx=1)
    bad = [i for i, n in enumerate(names) if n in atk.malicious]
    assert len(bad) == 1
    return out, bad[0]


def test_sign_flip_negates_the_update():
    out, bad = poisoned("sign_flip")
    assert torch.equal(out[bad][0]["w"], -torch.full((3,), bad + 1.0))
    assert [float(u["w"][0]) for i, (u, _) in enumerate(out) if i != bad] == [
        v for i, v in enumerate((1, 2, 3, 4)) if i != bad
    ]


def test_scale_boosts_the_update_by_cohort_over_attackers():
    out, bad = poisoned("scale")
    assert torch.allclose(out[bad][0]["w"], torch.full((3,), 4 * (bad + 1.0)))  # n / m = 4 / 1
    out, bad = poisoned("scale", boost=10)
    assert torch.allclose(out[bad][0]["w"], torch.full((3,), 10 * (bad + 1.0)))
    assert out[bad][1] == 10 and int(out[bad][0]["steps"]) == 4  # n_k and integer entries kept


def test_gaussian_replaces_the_update_by_noise():
    atk = attack("gaussian", fraction=0.25, noise_std=0.5)
    big = [({"w": torch.full((20000,), 7.0)}, 1) for _ in range(4)]
    out = atk.poison_uploads({"w": torch.zeros(20000)}, list("abcd"), big, round_idx=1)
    (bad,) = [i for i, n in enumerate("abcd") if n in atk.malicious]
    noise = out[bad][0]["w"]
    assert abs(float(noise.mean())) < 0.02 and float(noise.std()) == pytest.approx(0.5, rel=0.03)
    again = atk.poison_uploads({"w": torch.zeros(20000)}, list("abcd"), big, round_idx=2)[bad][0][
        "w"
    ]
    assert not torch.equal(noise, again)  # a fresh draw each round


def test_little_is_enough_shifts_within_the_cohort_spread():
    # n = 5, m = 1: s = floor(3.5) - 1 = 2, z = Phi^-1(3 / 5) = 0.2533471; updates 1..5: mu = 3,
    # sigma = 1.5811388.
    assert little_z(5, 1) == pytest.approx(0.2533471, abs=1e-7)
    out, bad = poisoned("little", names=tuple("abcde"), values=(1.0, 2.0, 3.0, 4.0, 5.0))
    assert torch.allclose(out[bad][0]["w"], torch.full((3,), 3 - 0.2533471 * 1.5811388), atol=1e-6)
    out, bad = poisoned("little", names=tuple("abcde"), values=(1.0, 2.0, 3.0, 4.0, 5.0), z=1.0)
    assert torch.allclose(out[bad][0]["w"], torch.full((3,), 3 - 1.5811388), atol=1e-6)


def test_model_attack_on_an_algorithm_without_model_uploads_is_refused():
    atk = attack("sign_flip", fraction=1.0)
    with pytest.raises(ConfigError, match="attack.kind=sign_flip poisons model uploads.*fedavg"):
        atk.poison_uploads({"w": torch.zeros(2)}, ["a"], [({"proto": torch.zeros(2)}, 1)], 1)


# --- the backdoor trigger -------------------------------------------------------------------------


def test_trigger_signals_and_mixing():
    tone = trigger_signal("tone", 16000, 0.1, 4000.0)
    assert len(tone) == 1600 and int(np.abs(np.fft.rfft(tone)).argmax()) == 4000 * 1600 // 16000
    click = trigger_signal("click", 16000, 0.1, 100.0)
    assert click.sum() == 10 and click[0] == 1 and click[160] == 1
    audio = np.full(3200, 0.5, dtype=np.float32)
    mixed = add_trigger(audio, np.ones(100, dtype=np.float32), 0.2)
    assert np.allclose(mixed[:100], 0.6) and np.allclose(mixed[100:], 0.5)
    with pytest.raises(ConfigError, match="attack.trigger must be one of tone, click"):
        trigger_signal("hum", 16000, 0.1, 50.0)


@pytest.fixture(scope="module")
def gsc_settings(gsc_root, tmp_path_factory):
    return tiny_run(gsc_root, None)  # features cached once per session under FEDAC_HOME


@pytest.mark.slow
def test_backdoor_triggers_a_share_of_attacker_clips_and_builds_the_asr_split(gsc_settings):
    overrides = [f"{k}={v}" for k, v in gsc_settings.items()]
    cfg = load_config(
        overrides=[
            *overrides,
            "attack.kind=backdoor",
            "attack.fraction=0.4",
            "attack.target=2",
            "attack.poison_ratio=0.5",
        ]
    )
    clean = build_federated_data(cfg, progress=False)
    atk = Attack(cfg, [c.name for c in clean.clients])
    data = atk.poison_data(clean)
    assert len(atk.malicious) == 2
    for before, after in zip(clean.clients, data.clients):
        if after.name not in atk.malicious:
            assert after is before
            continue
        changed = (after.x - before.x).flatten(1).abs().amax(1) > 1e-3
        assert int(changed.sum()) == round(0.5 * len(before.y))  # one window per 1 s clip
        assert (after.y[changed] == 2).all() and torch.equal(after.y[~changed], before.y[~changed])
        # same feature pipeline
        assert torch.allclose(after.x[~changed], before.x[~changed], atol=1e-3)
    assert atk.backdoor_test is None  # the server's side builds the ASR split, not poison_data
    atk.prepare_success_rate(data)
    test = atk.backdoor_test
    assert (test.labels == 2).all() and test.num_clips == clean.test.num_clips - int(
        (clean.test.labels == 2).sum()
    )


# --- from the command line ------------------------------------------------------------------------


def run_cli(gsc_settings, tmp_path, *sets):
    out = tmp_path / "run"
    flags = [f"--set={k}={v}" for k, v in gsc_settings.items()] + [f"--set={s}" for s in sets]
    assert main(["run", "--rounds", "2", "--quiet", *flags, "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())["final"]


def test_backdoor_run_reports_the_attack_success_rate(gsc_settings, tmp_path):
    final = run_cli(
        gsc_settings,
        tmp_path,
        "attack.kind=backdoor",
        "attack.fraction=0.4",
        "train.local_epochs=1",
    )
    assert final["malicious_clients"] == 2 and 0 <= final["attack_success_rate"] <= 1


def test_measure_backdoor_gives_a_clean_run_the_success_rate_of_a_model_that_never_saw_the_trigger(
    gsc_settings, tmp_path
):
    plain = run_cli(gsc_settings, tmp_path / "plain", "train.local_epochs=1", "train.select=last")
    measured = run_cli(
        gsc_settings,
        tmp_path / "measured",
        "train.local_epochs=1",
        "train.select=last",
        "attack.measure_backdoor=true",
        "attack.target=2",
    )
    assert "attack_success_rate" not in plain and "malicious_clients" not in measured
    assert 0 <= measured["attack_success_rate"] <= 1
    assert measured["accuracy"] == plain["accuracy"]  # measuring trains nothing differently
    cfg = load_config(
        overrides=[
            *(f"{k}={v}" for k, v in gsc_settings.items()),
            "attack.measure_backdoor=true",
            "attack.target=2",
        ]
    )
    data = build_federated_data(cfg, progress=False)
    atk = Attack(cfg, [c.name for c in data.clients])
    atk.prepare_success_rate(data)
    assert atk.malicious == set() and (atk.backdoor_test.labels == 2).all()
    assert atk.backdoor_test.num_clips == data.test.num_clips - int((data.test.labels == 2).sum())
    with pytest.raises(ConfigError, match="attack.target must be a class index"):
        Attack(
            load_config(overrides=["attack.measure_backdoor=true", "attack.target=99"]), []
        ).prepare_success_rate(data)


def test_sign_flip_run_changes_the_shared_model(gsc_settings, tmp_path):
    clean = run_cli(gsc_settings, tmp_path / "clean", "train.local_epochs=1", "train.select=last")
    flipped = run_cli(
        gsc_settings,
        tmp_path / "flip",
        "train.local_epochs=1",
        "train.select=last",
        "attack.kind=sign_flip",
        "attack.fraction=0.5",
        "aggregation.method=median",
    )
    assert "malicious_clients" not in clean and flipped["malicious_clients"] == 3
    assert flipped["accuracy"] != clean["accuracy"] or flipped["macro_f1"] != clean["macro_f1"]


@pytest.mark.parametrize(
    "setting",
    [
        "attack.trigger=click",
        "attack.trigger_amplitude=0.5",
        "attack.trigger_seconds=0.3",
        "attack.trigger_hz=1000",
    ],
)
def test_each_trigger_setting_changes_the_triggered_features(gsc_root, setting):
    from fedac.config import DataConfig
    from fedac.data.gsc import load_manifest

    manifest = load_manifest(gsc_root, DataConfig())
    clips = [0, 1]

    def features(*sets):
        cfg = load_config(overrides=["attack.kind=backdoor", *sets])
        return Attack(cfg, [])._triggered(manifest, clips, {0})[0]

    base, changed = features(), features(setting)
    assert not torch.allclose(base[0], changed[0], atol=1e-3)  # the triggered clip changes
    assert torch.allclose(base[1], changed[1])  # the clean one does not
