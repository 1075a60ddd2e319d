"""Chunk sizing (training/packing.py): auto is the CPU's 16 on the CPU; on a GPU the first chunk is
a probe whose measured memory per client sizes every later chunk from the memory free at that
moment. The GPU's allocator counters are faked here (CI has no GPU); the last test reads the real
ones on a CUDA device."""

from __future__ import annotations

import pytest
import torch
from test_cohort import assert_same_run, federate, make_algorithm, make_clients

from fedac.training.packing import CPU_CHUNK, MEMORY_FRACTION, PROBE_CLIENTS, Packing
from fedac.training.stacking import cohort_workers, plan_chunks

SIZES = [
    37,
    16,
    5,
    23,
    40,
    9,
    12,
    30,
    18,
    7,
    26,
    33,
    3,
    21,
    15,
    11,
    28,
    8,
    19,
    24,
    6,
    14,
    35,
    10,
    17,
    22,
    4,
    29,
    13,
    20,
]


class FakeGauge:
    """A device whose probe chunk peaks at `per_client` bytes per client above `base`, and whose
    free memory reads `free` in turn (the last value repeating), as uploads left on the device
    shrink it."""

    def __init__(self, per_client: int, free: list[int], base: int = 10_000):
        self.per_client, self.free_values, self.base = per_client, list(free), base
        self.probes: list[int] = []
        self.probe_size = PROBE_CLIENTS

    def free(self) -> int:
        return self.free_values.pop(0) if len(self.free_values) > 1 else self.free_values[0]

    def begin(self) -> int:
        self.probes.append(1)
        return self.base

    def peak(self) -> int:
        return self.base + self.per_client * self.probe_size


def gpu_packing(gauge: FakeGauge) -> Packing:
    return Packing(0, torch.device("cpu"), gauge=gauge)


def test_the_probe_sizes_later_chunks_from_the_memory_free_then():
    clients = make_clients(SIZES)
    cfg = make_algorithm()[0].cfg.train
    per_client = 1_000
    gauge = FakeGauge(
        per_client,
        free=[int(16 * per_client / MEMORY_FRACTION) + 1, int(4 * per_client / MEMORY_FRACTION)],
    )
    packing = gpu_packing(gauge)
    chunks = list(plan_chunks(clients, range(len(clients)), cfg, 1, 0, packing, "crnn_lite"))
    assert [len(c) for c in chunks] == packing.last_sizes == [PROBE_CLIENTS, 16, 4, 2]
    assert packing.bytes_per_client == {"crnn_lite": per_client}
    sizes = [d.num_samples for c in chunks for d in c.datas]
    # every client once, largest first, the probe the largest
    assert sizes == sorted(SIZES, reverse=True)
    # the next round reuses the measurement: no probe, every chunk sized from the free memory
    chunks = list(plan_chunks(clients, range(len(clients)), cfg, 2, 0, packing, "crnn_lite"))
    assert len(gauge.probes) == 1 and [len(c) for c in chunks] == [4] * 7 + [2]
    # another architecture is probed on its own
    list(plan_chunks(clients, range(len(clients)), cfg, 2, 0, packing, "crnn_tiny"))
    assert len(gauge.probes) == 2 and set(packing.bytes_per_client) == {"crnn_lite", "crnn_tiny"}


def test_a_chunk_holds_one_client_when_memory_is_short():
    packing = gpu_packing(FakeGauge(1_000, free=[10]))
    clients = make_clients(SIZES[:12])
    chunks = list(
        plan_chunks(clients, range(12), make_algorithm()[0].cfg.train, 1, 0, packing, "m")
    )
    assert [len(c) for c in chunks] == [PROBE_CLIENTS] + [1] * 4


def test_auto_on_the_cpu_is_the_cost_models_chunks_of_at_most_16():
    # equal clients, one worker: nothing to gain from smaller chunks
    clients = make_clients([16] * 40)
    cfg = make_algorithm("train.cohort_workers=1")[0].cfg.train
    assert cfg.cohort_chunk == 0  # the default is auto
    packing = Packing(0, torch.device("cpu"))
    assert not packing.by_memory and packing.fixed_chunk == CPU_CHUNK
    sizes = [len(c) for c in plan_chunks(clients, range(len(clients)), cfg, 1, 0, packing, "m")]
    assert sum(sizes) == len(clients) and max(sizes) == CPU_CHUNK
    # a fixed size wins on a GPU too
    fixed = Packing(5, torch.device("cpu"), gauge=FakeGauge(1, free=[10**12]))
    assert not fixed.by_memory
    assert (
        max(len(c) for c in plan_chunks(clients, range(len(clients)), cfg, 1, 0, fixed, "m")) == 5
    )


def test_one_worker_per_gpu_when_auto():
    cfg = make_algorithm()[0].cfg.train
    assert cohort_workers(cfg, torch.device("cuda")) == 1
    cfg.cohort_workers = 3
    assert cohort_workers(cfg, torch.device("cuda")) == 3  # a setting is a setting


@pytest.mark.parametrize("algorithm", ["fedavg", "fedmlac"])
def test_packed_chunks_give_the_numbers_of_one_chunk(algorithm):
    clients = make_clients(SIZES)
    one = make_algorithm(
        f"algorithm={algorithm}", "train.cohort_chunk=64", "train.execution=cohort"
    )
    expected = federate(one[0], clients, rounds=2)
    algo, _ = make_algorithm(f"algorithm={algorithm}", "train.execution=cohort")
    algo.packing = gpu_packing(FakeGauge(1_000, free=[int(6 * 1_000 / MEMORY_FRACTION)]))
    assert_same_run(expected, federate(algo, clients, rounds=2), tol=1e-6)
    assert algo.packing.last_sizes == [6] * 5  # the last round: 30 clients, 6 a chunk


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="reads the CUDA allocator (benchmarks/gpu/check.sh)"
)
def test_on_a_gpu_auto_measures_the_probe_and_packs_the_rest_together():
    from fedac.training.device import to_device

    clients = [to_device(c, "cuda") for c in make_clients(SIZES)]
    algo, _ = make_algorithm("algorithm=fedmlac", "train.execution=cohort", "train.device=cuda")
    federate(algo, clients, rounds=1)
    (per_client,) = algo.packing.bytes_per_client.values()
    assert 1e4 < per_client < 1e9  # a CRNN client of a chunk: more than nothing, less than a GB
    assert algo.packing.last_sizes == [PROBE_CLIENTS, len(SIZES) - PROBE_CLIENTS]


# --- residency: the clients' data and personalized models on the device or the host ---------------


def test_residency_auto_keeps_clients_on_the_gpu_while_half_its_free_memory_holds_them():
    from fedac.training.packing import RESIDENT_FRACTION, client_home

    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    gauge = FakeGauge(1, free=[1_000])
    fits, spills = (
        (lambda: int(1_000 * RESIDENT_FRACTION)),
        (lambda: int(1_000 * RESIDENT_FRACTION) + 1),
    )
    assert client_home("auto", gpu, fits, gauge) == gpu
    assert client_home("auto", gpu, spills, gauge) == cpu
    assert client_home("host", gpu, fits, gauge) == cpu
    assert client_home("device", gpu, spills, gauge) == gpu
    never = lambda: pytest.fail("the CPU asks for no size")  # noqa: E731
    assert (
        client_home("auto", cpu, never, gauge) == cpu
        and client_home("host", cpu, never, gauge) == cpu
    )


def test_residency_host_gives_the_numbers_of_resident_clients_and_resumes(gsc_root, tmp_path):
    """On a GPU (FEDAC_TEST_DEVICE=cuda) the host's clients are page-locked CPU tensors copied in
    every round; on the CPU the run's device is their home too, and the same code runs without
    copies."""
    from fedac.config import load_config
    from fedac.engine.data import build_federated_data
    from fedac.engine.simulator import Simulator
    from helpers import tiny_run

    settings = {
        **tiny_run(gsc_root, tmp_path / "cache"),
        "algorithm": "fedmlac",
        "model.client_model": "crnn_tiny",
        "fedmlac.plugin_model": "crnn_tiny",
        "train.rounds": 3,
        "train.local_epochs": 1,
    }
    config = lambda **extra: load_config(
        overrides=[f"{k}={v}" for k, v in {**settings, **extra}.items()]
    )  # noqa: E731
    data = build_federated_data(config(), progress=False)
    resident = Simulator(
        config(**{"train.client_memory": "device"}), tmp_path / "resident", data, progress=False
    ).run()
    host = config(**{"train.client_memory": "host"})
    assert Simulator(host, tmp_path / "host", data, progress=False).run(stop_after=2) is None
    sim = Simulator(host, tmp_path / "host", data, progress=False)
    results = sim.run(resume=True)
    assert sim.resumed_from == 2 and sim.client_home.type == "cpu"
    on_gpu = sim.device.type == "cuda"
    states = [v for state in sim.state.clients.values() for v in state.values()]
    assert states and all(v.device.type == "cpu" and v.is_pinned() == on_gpu for v in states)
    assert (
        all(c.x.device.type == "cpu" for c in sim.data.clients)
        and sim.data.test.x.device == sim.device
    )
    for key in ("accuracy", "personalized_accuracy_mean", "personalized_local_accuracy_mean"):
        assert results["final"][key] == pytest.approx(resident["final"][key], abs=1e-6), key


# --- train.devices: one run's chunks spread over several devices ----------------------------------


def test_devices_setting_names_what_it_cannot_use():
    from fedac.config import load_config
    from fedac.errors import ConfigError
    from fedac.training.device import resolve_devices

    cpu = torch.device("cpu")
    assert resolve_devices("", cpu) == [cpu] and resolve_devices("cpu, cpu", cpu) == [cpu, cpu]
    for bad in ("gpu", "cuda:0,,cpu", "auto,cpu"):
        with pytest.raises(ConfigError, match="train.devices"):
            load_config(overrides=[f"train.devices={bad}"])
    if not torch.cuda.is_available():
        for missing in ("all", "cuda:0,cpu"):
            with pytest.raises(ConfigError, match="train.devices"):
                resolve_devices(missing, cpu)


def spread_devices() -> str:
    """Two devices this machine has: the GPU and the CPU where there is a GPU (real copies both
    ways), else the CPU twice (the dispatch and bookkeeping, without copies)."""
    return "cuda:0,cpu" if torch.cuda.is_available() else "cpu,cpu"


@pytest.mark.parametrize("algorithm", ["fedprox", "fedmlac"])
def test_chunks_spread_over_devices_give_the_numbers_of_one_device(algorithm, monkeypatch):
    import threading

    from fedac.training.stacking import CohortChunk

    clients = make_clients(SIZES)
    settings = [
        f"algorithm={algorithm}",
        "model.dropout=0",
        "train.cohort_chunk=4",
        "train.execution=cohort",
        "fedprox.mu=0.5",
    ]
    expected = federate(make_algorithm(*settings)[0], clients, rounds=2)
    algo, _ = make_algorithm(*settings, f"train.devices={spread_devices()}")
    assert len(algo.devices) == 2
    moves, real_to = [], CohortChunk.to
    monkeypatch.setattr(
        CohortChunk,
        "to",
        lambda chunk, device: (
            moves.append((torch.device(device), threading.current_thread().name, len(chunk)))
            or real_to(chunk, device)
        ),
    )
    # a GPU's and the CPU's float rounding differ (and their GRU kernels): a looser tolerance across
    # them
    assert_same_run(
        expected, federate(algo, clients, rounds=2), tol=1e-4 if torch.cuda.is_available() else 1e-5
    )
    assert sum(size for *_, size in moves) == 2 * len(SIZES)  # every client of both rounds, once
    assert {device for device, *_ in moves} == set(algo.devices)
    # chunks trained on the device workers
    assert any(name.startswith("fedac-device") for _, name, _ in moves)


def test_over_several_devices_each_gets_an_equal_share_and_the_probe_trains_alone(monkeypatch):
    import threading

    from fedac.training.stacking import CohortChunk

    clients = make_clients(SIZES)
    settings = ["algorithm=fedavg", "model.dropout=0", "train.execution=cohort"]
    expected = federate(make_algorithm(*settings, "train.cohort_chunk=64")[0], clients, rounds=2)
    algo, _ = make_algorithm(*settings, f"train.devices={spread_devices()}")
    algo.packing = Packing(0, algo.devices[0], gauge=FakeGauge(1_000, free=[10**9]), spread=2)
    moves, real_to = [], CohortChunk.to
    monkeypatch.setattr(
        CohortChunk,
        "to",
        lambda chunk, device: (
            moves.append((threading.current_thread().name, len(chunk))) or real_to(chunk, device)
        ),
    )
    assert_same_run(
        expected, federate(algo, clients, rounds=2), tol=1e-4 if torch.cuda.is_available() else 1e-5
    )
    half = (len(SIZES) - PROBE_CLIENTS + 1) // 2
    # round 1: the probe alone in the caller's thread, then the rest in two equal chunks on the
    # device workers
    assert moves[0] == (threading.current_thread().name, PROBE_CLIENTS)
    assert sorted(size for _, size in moves[1:3]) == [len(SIZES) - PROBE_CLIENTS - half, half]
    # round 2: measured, so the round's clients in two equal chunks, one per device, trained at once
    assert [size for _, size in moves[3:]] == [len(SIZES) // 2] * 2 and algo.packing.last_sizes == [
        15,
        15,
    ]
    assert all(name.startswith("fedac-device") for name, _ in moves[1:])
