"""Resume proven to resume: a resumed run starts from its checkpoint (it trains only the remaining
rounds, and a changed checkpoint changes the result), and a real `fedac run` killed by a signal
mid-run resumes to the parameters of an uninterrupted run. A deterministic restart from round 0
would give the same final parameters, so equality with an uninterrupted run alone cannot tell
resuming from restarting."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedac.config import load_config
from fedac.engine.checkpoint import load_checkpoint, save_checkpoint
from fedac.engine.data import build_federated_data
from fedac.engine.simulator import Simulator
from fedac.engine.state import RunState
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
ROUNDS, STOP = 5, 3
FEDMLAC = {
    "algorithm": "fedmlac",
    "model.client_model": "crnn_tiny",
    "fedmlac.plugin_model": "crnn_tiny",
}


@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    return {
        **tiny_run(gsc_root, tmp_path_factory.mktemp("resume_cache")),
        "train.rounds": ROUNDS,
        "train.local_epochs": 1,
        "train.eval_every": 2,
    }


def config(settings, **extra):
    return load_config(overrides=[f"{k}={v}" for k, v in {**settings, **extra}.items()])


@pytest.fixture(scope="module")
def data(settings):
    return build_federated_data(config(settings), progress=False)


def trained_rounds(sim: Simulator) -> list[int]:
    """Spy on the rounds `sim` trains."""
    rounds: list[int] = []
    real = sim.run_round
    sim.run_round = lambda state, r: rounds.append(r) or real(state, r)
    return rounds


def params_equal(a: dict, b: dict) -> bool:
    """Bit for bit, on the CPU: a checkpoint's tensors load where they were saved (the CPU) while a
    run's state lives on its device (CUDA on a GPU machine), and torch.equal refuses two devices."""
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


@pytest.mark.parametrize("extra", [{}, FEDMLAC], ids=["fedavg", "fedmlac"])
def test_resumed_run_trains_only_the_remaining_rounds(settings, data, tmp_path, extra):
    cfg = config(settings, **extra)
    assert Simulator(cfg, tmp_path, data, progress=False).run(stop_after=STOP) is None
    resumed = Simulator(cfg, tmp_path, data, progress=False)
    rounds = trained_rounds(resumed)
    results = resumed.run(resume=True)
    assert rounds == [4, 5]
    assert (results["resumed_from"], results["rounds_trained"], results["rounds"]) == (
        STOP,
        ROUNDS - STOP,
        ROUNDS,
    )
    # the history before the checkpoint comes from the checkpoint, not from training again
    assert [row["round"] for row in results["history"]] == [2.0, 4.0, 5.0]


def tamper(state: RunState, extra: dict) -> str:
    """Change the checkpoint's global model (FedAvg) or one client's own model (FedMLAC); returns
    what."""
    if extra:
        name = sorted(state.clients)[0]
        state.clients[name] = {
            k: v * 0.5 if v.is_floating_point() else v for k, v in state.clients[name].items()
        }
        return name
    state.server["params"] = {
        k: v * 0.5 if v.is_floating_point() else v for k, v in state.server["params"].items()
    }
    return "server"


@pytest.mark.parametrize("extra", [{}, FEDMLAC], ids=["fedavg", "fedmlac"])
@pytest.mark.slow
def test_resume_continues_from_what_the_checkpoint_holds(settings, data, tmp_path, extra):
    # every client trains again after the stop
    cfg = config(settings, **extra, **{"train.fraction": 1.0})
    straight = Simulator(cfg, tmp_path / "straight", data, progress=False)
    straight.run()
    Simulator(cfg, tmp_path / "run", data, progress=False).run(stop_after=STOP)
    state = load_checkpoint(tmp_path / "run")
    what = tamper(state, extra)
    save_checkpoint(tmp_path / "run", state)

    # what continuing the changed state for the remaining rounds gives, round by round
    expected = copy.deepcopy(state)
    # run() makes its directory; rounds stepped by hand may log there
    (tmp_path / "stepper").mkdir()
    stepper = Simulator(cfg, tmp_path / "stepper", data, progress=False)
    for r in range(STOP + 1, ROUNDS + 1):
        stepper.run_round(expected, r)

    resumed = Simulator(cfg, tmp_path / "run", data, progress=False)
    resumed.run(resume=True)
    assert params_equal(resumed.state.server["params"], expected.server["params"])
    assert not params_equal(resumed.state.server["params"], straight.state.server["params"])
    if what != "server":
        assert params_equal(resumed.state.clients[what], expected.clients[what])
        assert not params_equal(resumed.state.clients[what], straight.state.clients[what])


def wait_for_checkpoint(
    run_dir: Path, proc: subprocess.Popen, at_least: int, timeout: float = 300.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"fedac run exited ({proc.returncode}) before round {at_least}: "
                f"{proc.stderr.read()}"
            )
        try:
            if load_checkpoint(run_dir).round >= at_least:
                return
        except Exception:  # not written yet (the rename makes a checkpoint appear whole)
            pass
        time.sleep(0.02)
    pytest.fail(f"no checkpoint of round {at_least} after {timeout} s")


@pytest.mark.slow
def test_killed_fedac_run_resumes_to_the_uninterrupted_parameters(settings, data, tmp_path):
    rounds = 12
    flags = {**settings, "train.rounds": rounds, "train.checkpoint_every": 1, "train.eval_every": 4}
    fedac = str(Path(sys.executable).with_name("fedac"))
    run_dir = tmp_path / "killed"
    argv = [
        fedac,
        "run",
        "--quiet",
        "--out",
        str(run_dir),
        *[f"--set={k}={v}" for k, v in flags.items()],
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_checkpoint(run_dir, proc, at_least=2)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = load_checkpoint(run_dir).round
    assert 2 <= killed_at < rounds and not (run_dir / "results.json").exists()

    done = subprocess.run(
        [fedac, "run", "--resume", str(run_dir), "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["resumed_from"], results["rounds_trained"], results["rounds"]) == (
        killed_at,
        rounds - killed_at,
        rounds,
    )

    straight = Simulator(
        load_config(run_dir / "config.yaml"), tmp_path / "straight", data, progress=False
    )
    expected = straight.run()
    assert params_equal(load_checkpoint(run_dir).server["params"], straight.state.server["params"])
    assert results["final"] == expected["final"]


def test_continue_to_leaves_an_unfinished_run_of_the_new_schedule(tmp_path):
    """`continue_to` (fedac run --resume --rounds, a grown table) makes a finished run one of more
    rounds: config.yaml says the new last round, results.json of the old one goes (read back by
    anyone, even without the rounds to compare, the run is unfinished), the checkpoint it resumes
    from stays byte for byte."""
    from fedac.config import save_config
    from fedac.engine.checkpoint import continue_to
    from fedac.experiments.compare import finished_results

    cfg = load_config(overrides=["train.rounds=2"])
    save_config(cfg, tmp_path / "config.yaml")
    (tmp_path / "results.json").write_text(json.dumps({"rounds": 2}))
    (tmp_path / "checkpoint.pt").write_bytes(b"state")
    assert finished_results(tmp_path) == {"rounds": 2}
    cfg.train.rounds = 5
    continue_to(tmp_path, cfg)
    assert load_config(tmp_path / "config.yaml").train.rounds == 5
    assert finished_results(tmp_path) is None
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"state"
    continue_to(tmp_path, cfg)  # (again, with no results.json: nothing to remove)
    assert load_config(tmp_path / "config.yaml").train.rounds == 5
