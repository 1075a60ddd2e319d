"""The compatibility matrix (settings/compatibility.py), walked.

Fast part: every registered algorithm x codec x clock mode x deployment (the simulator, a Flower
deployment, one with SecAgg+) is either refused with a one-line reason or accepted; every rule
refuses at least one cell of the walk (no rule is dead), the two gaps the matrix closed are
refused (zero-shot with any `system.*`, FedRep with partial work), and where the engine keeps its
own copy of a rule (Compressor, SystemClock) it agrees with the matrix cell for cell.

Slow part: 2-round runs of a tiny federation (the test GSC tree, crnn_tiny) of every accepted
cell of: every algorithm alone, every algorithm under a sync clock with a deadline and partial
work, every algorithm under FedBuff, every codec with three algorithms of different kinds, every
clock mode, and the triples clock x partial work x compression. Each runs on the stacked and the
sequential path with equal results: every tensor of the server's and the clients' states within
`TOLERANCE` (float32 rounding of a vmapped computation against a loop; the paths draw the same
batches), the same clients trained, the same virtual time. A cell the stacked path cannot take
(`runtime.execution=cohort` refused with the reason) counts as refused there.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
from pathlib import Path

import pytest
import torch

from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.flower.settings import DeploymentSettings, SecAggSettings
from fedac.settings.algorithms import ALGORITHMS
from fedac.settings.codecs import CODECS
from fedac.settings.compatibility import CLOCK_MODES, RULES, check, parts_of, refusals
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")

#: Clock settings per walked mode: off, sync with a deadline and partial work, the async modes.
CLOCKS = {
    "off": [],
    "sync-partial": [
        "system.devices=synthetic",
        "system.availability=synthetic",
        "system.deadline=0.5",
        "system.partial=true",
    ],
    "fedbuff": ["system.devices=synthetic", "system.mode=fedbuff", "system.buffer=2"],
    "fedasync": ["system.devices=synthetic", "system.mode=fedasync"],
}
#: Deployments walked: the simulator, Flower deployments (fedac's strategy or Flower's), with
#: SecAgg+.
DEPLOYMENTS = {
    "simulator": None,
    "flower": DeploymentSettings(None),
    "flower-strategy": DeploymentSettings(None, strategy="flower"),
    "secagg": DeploymentSettings(None, secagg=SecAggSettings(enabled=True)),
    "secagg-device": DeploymentSettings(
        None, strategy="flower", data_mode="device", secagg=SecAggSettings(enabled=True)
    ),
}
#: Settings that other rules concern, each walked over every algorithm, codec, clock and
#: deployment.
OTHERS = [
    (),
    ("dp.mode=client",),
    ("dp.mode=central",),
    ("attack.kind=sign_flip", "attack.fraction=0.2"),
    ("aggregation.method=median",),
    ("aggregation.weighting=uniform",),
    ("compression.download=true",),
    ("compression.error_feedback=true",),
    ("system.deadline=5",),
    ("model.heterogeneous=true",),
    ("selection.method=poc",),
    ("selection.method=oort",),
    ("selection.method=fedcs",),
]


def cell_config(algo: str, codec: str, clock: str, other=()):
    return load_config(
        overrides=[f"algorithm={algo}", f"compression.method={codec}", *CLOCKS[clock], *other]
    )


@pytest.fixture(scope="module")
def walk():
    """Every cell's refusals, {(algorithm, codec, clock, deployment, other): [(rule, reason)]}:
    every algorithm x codec x clock x deployment x each of OTHERS (a config loaded per algorithm,
    clock and other, its codec set on a copy)."""
    out = {}
    for algo, clock, other in itertools.product(ALGORITHMS.names(), CLOCKS, OTHERS):
        base = cell_config(algo, "none", clock, other)
        for codec in CODECS.names():
            cfg = copy.copy(base)
            cfg.compression = dataclasses.replace(base.compression, method=codec)
            for where, deployment in DEPLOYMENTS.items():
                out[algo, codec, clock, where, other] = refusals(parts_of(cfg, deployment))
    return out


def test_the_walk_covers_every_registered_part_and_every_rule(walk):
    assert {c[0] for c in walk} == set(ALGORITHMS.names())
    assert {c[1] for c in walk} == set(CODECS.names())
    assert {c[2] for c in walk} >= set(CLOCKS) and set(CLOCK_MODES) <= {"sync", *CLOCKS}
    fired = {name for found in walk.values() for name, _ in found}
    assert fired == {rule.name for rule in RULES}  # every rule refuses some cell
    accepted = [cell for cell, found in walk.items() if not found]
    assert len(accepted) > 100  # the matrix refuses combinations, not everything
    for found in walk.values():
        for _, reason in found:  # one line that names a setting to change
            assert "\n" not in reason and re.search(r"\w[\w.*-]*(=|\.\*)", reason)


def test_zeroshot_refuses_every_clock_setting():
    """The driver trains no weights on no clock: any system.* would be silently ignored."""
    for setting in [
        "system.mode=fedbuff",
        "system.devices=synthetic",
        "system.deadline=5.0",
        "system.partial=true",
        "system.dropout=0.1",
    ]:
        with pytest.raises(ConfigError, match=f"{setting} does not apply to --algorithm zeroshot"):
            check(load_config(overrides=["algorithm=zeroshot", setting]))
    check(load_config(overrides=["algorithm=zeroshot"]))


def test_fedrep_refuses_partial_work_and_methods_of_one_phase_accept_it():
    clock = CLOCKS["sync-partial"]
    with pytest.raises(ConfigError, match="fedrep trains two phases"):
        check(load_config(overrides=["algorithm=fedrep", *clock]))
    for algo in ("fedavg", "fedper", "lgfedavg", "fedbn", "ditto", "scaffold"):
        check(load_config(overrides=[f"algorithm={algo}", *clock]))


def test_qsgd_alone_runs_without_error_feedback_by_default():
    from fedac.rules.compression import Compressor

    check(load_config(overrides=["compression.method=qsgd"]))
    assert not Compressor(load_config(overrides=["compression.method=qsgd"])).feedback
    for method in ("topk", "randk", "int8", "bf16"):
        assert Compressor(load_config(overrides=[f"compression.method={method}"])).feedback
    off = load_config(overrides=["compression.method=topk", "compression.error_feedback=false"])
    assert not Compressor(off).feedback
    with pytest.raises(ConfigError, match="qsgd is unbiased"):
        check(load_config(overrides=["compression.method=qsgd", "compression.error_feedback=1"]))


def test_runs_refuse_before_any_data(tmp_path):
    """`fedac run`'s driver choice and the zero-shot driver check the matrix first: a data root
    that does not exist is never reached."""
    from fedac.engine.runner import runner_for
    from fedac.engine.zeroshot import ZeroShotDriver

    missing = f"data.root={tmp_path / 'nowhere'}"
    with pytest.raises(ConfigError, match="fedrep trains two phases"):
        runner_for(load_config(overrides=["algorithm=fedrep", missing, *CLOCKS["sync-partial"]]))
    with pytest.raises(ConfigError, match="system.mode=fedbuff does not apply"):
        ZeroShotDriver(
            load_config(overrides=["algorithm=zeroshot", missing, "system.mode=fedbuff"]), tmp_path
        )


# --- the runs ------------------------------------------------------------------------------------
#: Equal results across the paths: every state tensor within this (absolute, on weights of order
#: 0.1-1; float32 sums in another order on a 2-round tiny run differ by ~1e-7).
TOLERANCE = 1e-5
#: ... and for a quantising codec (int8, qsgd, bf16): float32's rounding can carry one coordinate
#: of an upload across a quantisation boundary on one path and not the other, a whole quantum
#: (max |update| / 127 for int8) in that coordinate. Under PyTorch's AVX2 kernels
#: (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 Xeon) three such cells differed by 1.9-2.0e-5.
QUANTISED_TOLERANCE = 1e-4
#: Three algorithms of different kinds for the codec walk: a FedAvg of the whole model, a partly
#: shared one, and one with personalised models beside a shared Plug-in.
CODEC_ALGORITHMS = ("fedavg", "fedper", "fedmlac")


#: Not run here: zero-shot trains fresh users through its own driver (no stacked path to compare;
#: its refusals are in the fast part), early exit fine-tunes SSL encoders (minutes, not seconds).
NOT_RUN = ("zeroshot", "earlyexit")
#: What an algorithm needs of the tiny federation to run at all.
NEEDS = {"central": ["data.partition=pooled", "central.warmup_epochs=1"]}


def run_cells() -> list[tuple[str, str, str]]:
    """(algorithm, codec, clock) of the slow walk (module docstring)."""
    names = [n for n in ALGORITHMS.names() if n not in NOT_RUN]
    cells = [(a, "none", clock) for a in names for clock in ("off", "sync-partial", "fedbuff")]
    cells += [(a, c, "off") for a in CODEC_ALGORITHMS for c in CODECS.names() if c != "none"]
    cells += [("fedavg", "none", "fedasync")]
    cells += [(a, c, "sync-partial") for a in ("fedavg", "fedper") for c in ("topk", "int8")]
    return list(dict.fromkeys(cells))


@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    return {
        **tiny_run(gsc_root, tmp_path_factory.mktemp("compat_cache")),
        "train.rounds": 2,
        "train.local_epochs": 1,
        "train.checkpoint_every": 100,
    }


@pytest.fixture(scope="module")
def data(settings):
    from fedac.engine.data import build_federated_data

    return build_federated_data(load_config(overrides=[f"{k}={v}" for k, v in settings.items()]))


def tensors(obj, path="") -> dict[str, torch.Tensor]:
    """Every tensor of a (nested) state by its path."""
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = vars(obj).items()
    else:
        return {}
    out = {}
    for key, value in items:
        out.update(tensors(value, f"{path}/{key}"))
    return out


def run_path(cfg, path: str, where: Path, data):
    from fedac.engine.simulator import Simulator

    cfg.runtime.execution = path
    sim = Simulator(cfg, where, data, progress=False)
    results = sim.run()
    return sim.state, results


@pytest.mark.slow
@pytest.mark.parametrize("algo, codec, clock", run_cells(), ids=["-".join(c) for c in run_cells()])
def test_an_accepted_cell_runs_alike_on_both_paths(algo, codec, clock, settings, data, tmp_path):
    overrides = [f"{k}={v}" for k, v in settings.items()]
    cfg = load_config(
        overrides=[
            *overrides,
            f"algorithm={algo}",
            f"compression.method={codec}",
            *CLOCKS[clock],
            *NEEDS.get(algo, []),
        ]
    )
    found = refusals(parts_of(cfg))
    if found:  # refused with a reason (the fast part checks the reasons)
        with pytest.raises(ConfigError):
            check(cfg)
        return
    # an accepted cell that the engine refuses is a gap in the matrix: it fails here
    data = None if algo in NEEDS else data  # (built for its own partition)
    sequential, seq_results = run_path(cfg, "sequential", tmp_path / "sequential", data)
    try:
        stacked, stacked_results = run_path(cfg, "cohort", tmp_path / "stacked", data)
    except ConfigError as exc:
        assert "cannot train stacked" in str(exc)
        return
    assert sequential.visits == stacked.visits
    if clock != "off":
        assert seq_results["system"]["virtual_time_s"] == pytest.approx(
            stacked_results["system"]["virtual_time_s"], rel=1e-12
        )
    a = tensors({"server": sequential.server, "clients": sequential.clients})
    b = tensors({"server": stacked.server, "clients": stacked.clients})
    assert a.keys() == b.keys()
    worst = max(
        ((x.double() - b[k].double()).abs().max().item() for k, x in a.items() if x.numel()),
        default=0.0,
    )
    from fedac.settings.codecs import codec_spec

    tolerance = QUANTISED_TOLERANCE if codec_spec(codec).quantised else TOLERANCE
    assert math.isfinite(worst) and worst <= tolerance, worst
