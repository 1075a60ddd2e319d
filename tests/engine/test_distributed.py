"""Several processes (engine/distributed.py): the sharing of a round's clients, and real `torchrun`
runs of 2 CPU processes (gloo) against one process. Every rank runs the same server update on the
same ordered uploads and a client's training does not depend on its rank; only the stacked path's
chunks differ (a rank stacks its own share), which moves numbers at float rounding. results.json is
therefore compared key by key, integers and strings exactly and floats to TOLERANCE (measured:
bit-identical for these runs; FedKWS-UI's train_loss, summed per chunk, moved by 3e-9 relative; the
weighted-sum methods' all-reduce sums in another order, float rounding again), clock readings aside.
A killed rank stops the run with its last checkpoint kept, which one process resumes; a hung rank
makes the others fail after `runtime.dist_timeout` naming the rank and the round."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedac.cli import main
from fedac.config import load_config
from fedac.engine.checkpoint import load_checkpoint
from fedac.engine.distributed import (
    PlanProgress,
    World,
    client_cost,
    current_world,
    run_shared,
    shares,
)
from fedac.training.device import nbytes
from helpers import tiny_run

ROOT = Path(__file__).resolve().parents[2]
#: Relative tolerance of a float in results.json: the stacked path's documented agreement
#: (architecture.md).
TOLERANCE = 1e-5
FEDMLAC = [
    "--algorithm",
    "fedmlac",
    "--set",
    "model.client_model=crnn_tiny",
    "--set",
    "fedmlac.plugin_model=crnn_tiny",
]


# --- sharing ------------------------------------------------------------------------------------
def test_shares_cover_the_cohort_once_and_balance_the_modelled_cost():
    costs = [client_cost(n, load_config().train) for n in (120, 7, 33, 64, 16, 16, 90, 2, 41)]
    for size in (1, 2, 3, 4):
        split = shares(costs, size)
        assert sorted(i for share in split for i in share) == list(range(len(costs)))
        assert all(share == sorted(share) for share in split)  # each share in cohort order
        loads = [sum(costs[i] for i in share) for share in split]
        # greedy costliest-first: within one client's cost
        assert max(loads) - min(loads) <= max(costs)
    assert shares(costs, 2) == shares(list(costs), 2)  # deterministic: every rank computes the same
    assert shares([5.0], 3) == [[0], [], []]  # a cohort smaller than the world: rank 0 trains


def test_client_cost_follows_the_schedule():
    train = load_config().train  # batch 16, 5 epochs, STEP_ROWS 4 per step
    assert client_cost(33, train) == 5 * (3 * 4.0 + 33)
    steps = load_config(overrides=["train.local_steps=7"]).train
    assert client_cost(33, steps) == client_cost(1000, steps) == 7 * (4.0 + 16)


def test_plan_progress_counts_a_share_as_the_round():
    seen = []
    bar = PlanProgress(seen.append, total=10, share=4)
    for count in (1, 2, 1):  # a client, a stacked chunk of two, a client
        bar(count)
    assert seen == [2, 5, 3]  # 10 * 1 // 4, 10 * 3 // 4 - 2, the rest
    bar.finish()
    assert sum(seen) == 10  # never past the round's total
    idle = []
    # a rank without clients: the gather completes the round
    PlanProgress(idle.append, total=3, share=0).finish()
    assert idle == [3]


def test_rank0s_client_bar_hears_of_the_whole_round_without_a_collective_inside(monkeypatch):
    """run_shared on rank 0 of 2 (the gather faked): its bar reaches the cohort's size as its own
    share ends, before the gather, and the results come back in cohort order."""
    from types import SimpleNamespace

    from fedac.training.stacking import client_progress, clients_done

    def train(payload, states, datas, round_idx, seed):
        for _ in datas:
            clients_done(1)
        return [f"client {d.num_samples}" for d in datas]

    cfg = load_config()
    plan = SimpleNamespace(
        algorithm=SimpleNamespace(cfg=cfg, device="cpu"), run=train, measured={}, adopt=dict
    )
    datas = [SimpleNamespace(num_samples=n) for n in (50, 40, 30, 20, 10, 5)]
    split = shares([client_cost(d.num_samples, cfg.train) for d in datas], 2)
    world, seen, at_gather = World(rank=0, size=2), [], []

    def gather(sent, what, round_idx):
        at_gather.append(sum(seen))
        assert sent[0] == split[0]
        return [sent, (split[1], [f"client {datas[i].num_samples}" for i in split[1]], {})]

    monkeypatch.setattr(world, "gather", gather)
    with client_progress(seen.append):
        out = run_shared(
            world,
            plan,
            None,
            [None] * 6,
            datas,
            1,
            0,
        )
    assert out == [f"client {d.num_samples}" for d in datas]
    assert 0 < len(split[0]) < 6 and at_gather == [6] and sum(seen) == 6


def test_evaluation_runs_this_ranks_share_and_gets_one_process_metrics(monkeypatch):
    """Rank 1 of 2 (the gather faked with rank 0's outputs): `evaluate` runs batches 1 and 3 of 4
    itself and ends with one process's metrics; `World.each` scores items 1, 3 itself and returns
    all in order."""
    import torch

    from fedac.engine.distributed import evaluation
    from fedac.training.evaluate import evaluate
    from fedac.training.types import EvalSplit

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    split = EvalSplit(torch.randn(10, 4), torch.arange(10) // 2, torch.randint(0, 3, (5,)))
    chunks = list(split.x.split(3))  # batches of 3 windows: 4 batches
    seen: list[int] = []
    model.register_forward_hook(lambda module, args, out: seen.append(len(args[0])))
    alone = evaluate(model, split, 3)
    assert seen == [3, 3, 3, 1]
    world, gathered = World(rank=1, size=2), []

    def gather(outputs, what, round_idx):
        gathered.append(outputs)
        with torch.no_grad():
            # rank 0's share: batches 0 and 2
            return [[model(chunks[0]), model(chunks[2])], outputs]

    monkeypatch.setattr(world, "gather", gather)
    seen.clear()
    with evaluation(world, 4):
        shared = evaluate(model, split, 3)
    assert seen[:2] == [3, 1] and len(gathered) == 1  # batches 1 and 3 here, then rank 0's (faked)
    assert shared == alone
    items, scored = list("abcde"), []
    monkeypatch.setattr(world, "gather", lambda mine, what, round_idx: [["A", "C", "E"], mine])
    assert world.each(items, lambda item: scored.append(item) or item.upper(), "test") == list(
        "ABCDE"
    )
    assert scored == ["b", "d"]


def test_the_weighted_sum_path_is_chosen_by_declared_capabilities():
    from types import SimpleNamespace

    from fedac.algorithms import ALGORITHMS
    from fedac.engine.distributed import sums_uploads

    def chosen(
        algorithm: str, method: str = "mean", dp: bool = False, poisons: str = "nothing"
    ) -> bool:
        cls = ALGORITHMS.load(algorithm)
        fake = cls.__new__(cls)  # (only its class and settings are read)
        fake.cfg = load_config(overrides=[f"aggregation.method={method}"], algorithm=algorithm)
        return sums_uploads(fake, SimpleNamespace(poisons=poisons), SimpleNamespace(on=dp))

    assert (
        chosen("fedavg")
        and chosen("fedprox")
        and chosen("fedadam")
        and chosen("fedavgm")
        and chosen("fedkwsui")
    )
    assert (
        not chosen("fedavg", "lpa")
        and not chosen("fedavg", "multikrum")
        and not chosen("fedavg", "median")
    )
    assert (
        not chosen("fedavg", dp=True)
        and not chosen("fedavg", poisons="upload")
        and chosen("fedavg", poisons="labels")
    )
    assert not chosen("fedmlac") and not chosen("fedkad")


@pytest.mark.parametrize("weighting", ["n_k", "uniform"])
def test_all_reduced_weighted_sums_give_the_weighted_mean(monkeypatch, weighting):
    """Two ranks' partial sums (the all-reduce faked: the other rank's buffer added) against
    rules/aggregation.weighted_mean of every upload, to float rounding; integer entries are not
    summed."""
    import torch
    import torch.distributed as dist

    from fedac.engine.distributed import all_reduce_mean
    from fedac.rules.aggregation import weighted_mean, weighted_uploads

    gen = torch.Generator().manual_seed(3)
    template = {
        "w": torch.zeros(4, 3),
        "b": torch.zeros(3),
        "count": torch.zeros((), dtype=torch.long),
    }
    uploads = [
        (
            {
                "w": torch.randn(4, 3, generator=gen),
                "b": torch.randn(3, generator=gen),
                "count": torch.tensor(k),
            },
            n,
        )
        for k, n in enumerate((5, 17, 2, 9, 30))
    ]
    buffers = []
    monkeypatch.setattr(
        dist, "all_reduce", lambda buffer, group=None: buffers.append(buffer.clone())
    )
    all_reduce_mean(World(), uploads[3:], template, weighting, 1)  # rank 1's part: its buffer
    monkeypatch.setattr(dist, "all_reduce", lambda buffer, group=None: buffer.add_(buffers[0]))
    # rank 0's, plus rank 1's
    means, total = all_reduce_mean(World(), uploads[:3], template, weighting, 1)
    expected = weighted_mean(weighted_uploads(uploads, weighting))
    assert total == (63 if weighting == "n_k" else 5) and means.keys() == {"w", "b"}
    for key in means:
        assert means[key].dtype == torch.float32
        torch.testing.assert_close(means[key], expected[key], rtol=1e-6, atol=1e-7)


def test_a_table_that_runs_its_own_cells_refuses_torchrun(monkeypatch, tmp_path):
    """`fedac reproduce` under torchrun runs its cells through compare.run_comparison on every rank;
    a layout with cells of its own (the zero-shot tables) would have each rank write the same run
    directories."""
    from fedac.engine import distributed
    from fedac.errors import ConfigError
    from fedac.experiments.catalog import EXPERIMENTS
    from fedac.experiments.runner import run_experiment
    from fedac.experiments.spec import Request

    spec = next(
        s for s in EXPERIMENTS.values() if s.layout is not None and s.layout.run_cell is not None
    )
    monkeypatch.setattr(distributed, "_world", World(rank=1, size=2))
    with pytest.raises(ConfigError, match="without torchrun"):
        run_experiment(spec, Request(out=tmp_path / "table", seeds=[0]))
    assert not (tmp_path / "table").exists()


def test_one_process_is_todays_path(monkeypatch):
    """Without torchrun's environment no process group is made and collectives are the identity."""
    from fedac.engine import distributed

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    world = distributed.start(1800.0, "cpu")
    assert (world.size, world.rank, world.distributed, world.writes) == (1, 0, False, True)
    assert (
        current_world() is world
        and world.gather("x", "test") == ["x"]
        and world.from_rank0(3, "test") == 3
    )
    assert distributed.scratch_run_dir(world, Path("somewhere")) == Path("somewhere")


def test_a_partial_torchrun_environment_is_an_error(monkeypatch):
    from fedac.engine import distributed
    from fedac.errors import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ConfigError, match="LOCAL_RANK"):
        distributed.start(1800.0, "cpu")
    assert current_world() == World()


# --- real processes -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    # (the CPU and gloo, whatever FEDAC_DEVICE points the suite at: both sides must run on one
    # device)
    run = {
        **tiny_run(gsc_root, tmp_path_factory.mktemp("dist_cache")),
        "train.local_epochs": 1,
        "runtime.threads": 1,
        "runtime.device": "cpu",
        # a path chosen by timing may differ between two runs timed apart (FedKWS-UI's two-headed
        # network stacks through vmap, which auto times): both sides take the stacked one
        "runtime.execution": "cohort",
    }
    return [arg for k, v in run.items() for arg in ("--set", f"{k}={v}")]


def torchrun(args: list[str], tmp: Path, **extra_env: str) -> subprocess.Popen:
    """2 processes of `args`; their temporary files (rank 1's scratch run directory) under `tmp`, so
    a killed rank's leftovers go with the test's folder."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(tmp), **extra_env}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *args,
    ]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


#: results.json's clock readings (auto's probe timings included) and the code's hash, which is taken
#: as each run writes (a checkout edited while the test runs would otherwise fail it;
#: test_code_version.py tests it).
NOT_COMPARED = ("wall_seconds", "execution_probe", "code_version")


def results(run_dir: Path) -> dict:
    def clean(obj):
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items() if k not in NOT_COMPARED}
        return [clean(v) for v in obj] if isinstance(obj, list) else obj

    return clean(json.loads((run_dir / "results.json").read_text()))


def client_rows(run_dir: Path) -> list[dict]:
    """clients.csv's rows, numbers as floats (empty cells as they are)."""
    import csv

    with open(run_dir / "clients.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows, run_dir
    return [
        {k: v if k == "client" or v == "" else float(v) for k, v in row.items()} for row in rows
    ]


def assert_same(a, b, where: str = "results.json") -> None:
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=1e-9) or (
            math.isnan(a) and math.isnan(b)
        ), f"{where}: {a} != {b}"
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a.keys() ^ b.keys())}"
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{where}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


ALL_REDUCE, ALL_GATHER = (
    "uploads by one all-reduce of their weighted sums",
    "uploads by an all-gather of every upload",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, how",
    [
        ([], ALL_REDUCE),
        (FEDMLAC, ALL_GATHER),
        (["--set", "aggregation.method=multikrum"], ALL_GATHER),
        (["--set", "dp.mode=central"], ALL_GATHER),
        (
            ["--set", "system.devices=synthetic", "--set", "system.mode=fedbuff"]
            + ["--set", "system.buffer=2"],
            ALL_GATHER,
        ),
    ],
    ids=["fedavg", "fedmlac_lpa", "multikrum", "dp_fedavg", "fedbuff"],
)
def test_two_processes_give_one_process_results(settings, tmp_path, extra, how):
    args = ["run", "--rounds", "3", "--seed", "1", *settings, *extra]
    # (not quiet: its first line)
    two = torchrun(
        ["-m", "fedac", *args, "--out", str(tmp_path / "two")],
        tmp_path,
        FEDAC_TRAFFIC_LOG=str(tmp_path / "traffic"),
    )
    assert main([*args, "--quiet", "--out", str(tmp_path / "one")]) == 0  # (one process, meanwhile)
    out, _ = two.communicate(timeout=300)
    assert two.returncode == 0, out
    assert f"2 processes (gloo), {how}" in out, out  # the path the capabilities chose
    one = results(tmp_path / "one")
    assert one["final"]["clients_trained"] > 1 and len(one["history"]) == 3
    assert_same(results(tmp_path / "two"), one)
    # every client's row at every evaluation, scored by the rank that held it and gathered
    # (clients.csv)
    assert_same(client_rows(tmp_path / "two"), client_rows(tmp_path / "one"), "clients.csv")
    # rank 0 alone wrote: one run directory, with every file one process writes
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(
        p.name for p in (tmp_path / "one").iterdir()
    )
    assert not list(tmp_path.glob("fedac-rank*"))  # rank 1's scratch folder is gone
    held = {
        rank: [
            json.loads(line)
            for line in (tmp_path / "traffic" / f"held{rank}.jsonl").read_text().splitlines()
        ]
        for rank in (0, 1)
    }
    states = load_checkpoint(tmp_path / "two").clients
    # each rank held only the own models of the clients it owns; the checkpoint all of them
    if extra == FEDMLAC:
        trained = one["final"]["clients_trained"]
        assert len(states) == trained == len(load_checkpoint(tmp_path / "one").clients)
        last = [held[rank][-1] for rank in (0, 1)]
        assert (
            all(0 < h["clients"] < trained for h in last)
            and sum(h["clients"] for h in last) == trained
        ), held
        assert sum(h["bytes"] for h in last) == nbytes(states)
    else:  # stateless: nothing held (a client's entry is None)
        assert not any(states.values()) and all(
            h["bytes"] == 0 for rank in (0, 1) for h in held[rank]
        )


@pytest.mark.slow
def test_client_states_move_with_the_world_size_on_resume(settings, tmp_path):
    """FedMLAC's own models: a checkpoint written by 2 processes (each rank's states gathered into
    it) resumes in 1 process, and one written by 1 process resumes in 2 (each rank handed the states
    it owns), both to the end of a run never stopped."""
    args = ["run", "--rounds", "3", "--seed", "1", *settings, *FEDMLAC, "--quiet"]
    two = torchrun(
        ["-m", "fedac", *args, "--stop-after", "1", "--out", str(tmp_path / "from_two")], tmp_path
    )
    # (meanwhile: the run never stopped)
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    assert main([*args, "--stop-after", "1", "--out", str(tmp_path / "from_one")]) == 0
    out, _ = two.communicate(timeout=300)
    assert two.returncode == 0, out
    assert (
        load_checkpoint(tmp_path / "from_two").round == 1
        and load_checkpoint(tmp_path / "from_two").clients
    )
    two = torchrun(
        ["-m", "fedac", "run", "--resume", str(tmp_path / "from_one"), "--quiet"], tmp_path
    )
    assert main(["run", "--resume", str(tmp_path / "from_two"), "--quiet"]) == 0
    out, _ = two.communicate(timeout=300)
    assert two.returncode == 0, out
    whole = results(tmp_path / "whole")
    whole.pop("resumed_from"), whole.pop("rounds_trained")
    for side in ("from_two", "from_one"):
        resumed = results(tmp_path / side)
        assert resumed.pop("resumed_from") == 1 and resumed.pop("rounds_trained") == 2
        assert_same(resumed, whole, side)
        assert_same(
            client_rows(tmp_path / side), client_rows(tmp_path / "whole"), f"{side}/clients.csv"
        )


@pytest.mark.slow
def test_compare_over_two_processes_gives_one_process_table(settings, tmp_path):
    """`fedac compare` under torchrun: every rank runs the same runs, rank 0 alone writes and
    prints."""
    args = [
        "compare",
        "--method",
        "FedAdam=fedadam",
        "--method",
        "FedKWS-UI=fedkwsui",
        "--seeds",
        "1",
        "--rounds",
        "2",
        *settings,
        "--quiet",
    ]
    two = torchrun(["-m", "fedac", *args, "--out", str(tmp_path / "two")], tmp_path)
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    out, _ = two.communicate(timeout=300)
    assert two.returncode == 0, out
    # (the all-reduce path: FedAdam's server steps on the mean; FedKWS-UI's private heads travel as
    # states)
    for run in ("FedAdam-s1", "FedKWS-UI-s1"):
        assert_same(results(tmp_path / "two" / run), results(tmp_path / "one" / run), run)
    summary = {
        side: json.loads((tmp_path / side / "summary.json").read_text()) for side in ("one", "two")
    }
    assert_same(summary["two"]["mean_std"], summary["one"]["mean_std"], "summary.json")
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(
        p.name for p in (tmp_path / "one").iterdir()
    )
    assert out.count("| FedKWS-UI |") == 1, out  # rank 0 alone printed the table
    assert not list(tmp_path.glob("fedac-rank*"))  # rank 1's scratch folders are gone


def rank_pid(parent: int, rank: int) -> int | None:
    """The pid of torchrun's worker of `rank` (a child of the agent `parent`, RANK in its
    environment)."""
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent
            ):
                if f"RANK={rank}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


@pytest.mark.slow
def test_a_killed_rank_stops_the_run_and_one_process_resumes_it(settings, tmp_path):
    rounds = 24
    args = ["run", "--rounds", str(rounds), "--seed", "1", *settings, "--quiet"]
    run_dir = tmp_path / "two"
    two = torchrun(["--max-restarts", "0", "-m", "fedac", *args, "--out", str(run_dir)], tmp_path)
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoint.pt").exists():
        assert two.poll() is None and time.monotonic() < deadline, (
            "no checkpoint before the run ended"
        )
        time.sleep(0.02)
    victim = rank_pid(two.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    out, _ = two.communicate(timeout=120)
    assert two.returncode != 0, out
    # rank 0 says how to go on: its gather failed (the usual case) or torchrun's SIGTERM came first
    assert f"fedac run --resume {run_dir}" in out, out
    kept = load_checkpoint(run_dir).round
    assert 1 <= kept < rounds, out
    assert not (run_dir / "results.json").exists()
    # one process continues the killed run to the numbers of a run never killed
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    resumed = results(run_dir)
    assert resumed.pop("resumed_from") == kept and resumed.pop("rounds_trained") == rounds - kept
    one = results(tmp_path / "one")
    one.pop("resumed_from"), one.pop("rounds_trained")
    assert_same(resumed, one)


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_at_one_round_with_a_checkpoint(settings, tmp_path):
    """SIGTERM to rank 1's PID alone: the ranks agree at the round's end (engine/rounds.py
    `_agree_on_stop`), all stop there with one checkpoint and the signal's status, long before
    runtime.dist_timeout (which a rank alone in the checkpoint's gather would wait out), and one
    process resumes the run."""
    rounds = 40
    args = ["run", "--rounds", str(rounds), "--seed", "1", *settings, "--quiet"]
    args += ["--set", "train.checkpoint_every=100", "--set", "runtime.dist_timeout=300"]
    run_dir = tmp_path / "two"
    two = torchrun(["--max-restarts", "0", "-m", "fedac", *args, "--out", str(run_dir)], tmp_path)
    deadline = time.monotonic() + 240
    while not (run_dir / "metrics.csv").exists():  # (the rounds are under way)
        assert two.poll() is None and time.monotonic() < deadline, "the run ended before round 1"
        time.sleep(0.02)
    victim = rank_pid(two.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGTERM)
    signalled = time.monotonic()
    out, _ = two.communicate(timeout=200)
    took = time.monotonic() - signalled
    assert two.returncode != 0 and took < 60, (took, out)
    assert "rank 1 received SIGTERM: every rank stops at the end of round" in out, out
    assert f"fedac run --resume {run_dir}" in out and "DistributedError" not in out, out
    kept = load_checkpoint(run_dir).round
    assert 1 <= kept < rounds and not (run_dir / "results.json").exists(), out
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    resumed = results(run_dir)
    assert (resumed["resumed_from"], resumed["rounds_trained"]) == (kept, rounds - kept)


HANG = textwrap.dedent("""
    import os, sys, time
    from fedac.engine import distributed
    world = distributed.start(float(sys.argv[1]), "cpu")
    if world.rank == 1:
        time.sleep(float(sys.argv[2]))  # never reaches the gather in time
    try:
        world.gather(world.rank, "gathering the clients' results", round_idx=7)
    except distributed.DistributedError as exc:
        print(f"ERROR {exc}", flush=True)
        os._exit(3)
    print("GATHERED", flush=True)
""")


@pytest.mark.slow
def test_a_hung_rank_times_out_naming_the_rank_and_round(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    started = time.monotonic()
    proc = torchrun(["--max-restarts", "0", str(script), "3", "12"], tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out
    assert "ERROR rank 0 of 2, round 7: gathering the clients' results failed after" in out, out
    assert "runtime.dist_timeout=3 s" in out and "fedac run --resume" in out
    assert time.monotonic() - started < 60
