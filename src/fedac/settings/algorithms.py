"""The algorithm registry: each algorithm's name -> its class ("module:Class", imported when a run
builds it), a one-line description and its settings dataclass (`settings/<name>.py`, named like its
class file in algorithms/).

Core layer (tests/test_import_layers.py): `Config` builds one section per registered algorithm from
this table and checks every setting before torch loads, so nothing here imports torch or any layer
above core. Plug-ins add algorithms through the `fedac.algorithms` entry-point group
(docs/extending.md).
"""

from __future__ import annotations

from fedac.registry import Entry, Registry

_S = "fedac.settings"
_OPT = f"{_S}.fedopt:FedOptConfig"  # FedAdam, FedYogi, FedAdagrad and FedAvgM share one section

ALGORITHMS = Registry(
    "algorithm",
    {
        "fedavg": Entry(
            "fedac.algorithms.fedavg:FedAvg", "FedAvg: the n_k-weighted mean of local SGD models"
        ),
        "fedprox": Entry(
            "fedac.algorithms.fedprox:FedProx",
            "FedProx: FedAvg with a proximal term to the global model",
            f"{_S}.fedprox:FedProxConfig",
        ),
        "fedadam": Entry(
            "fedac.algorithms.fedopt:FedAdam",
            "FedAdam: Adam on the server over the mean update (Reddi et al.)",
            _OPT,
            "fedopt",
        ),
        "fedyogi": Entry(
            "fedac.algorithms.fedopt:FedYogi",
            "FedYogi: Yogi on the server over the mean update",
            _OPT,
            "fedopt",
        ),
        "fedadagrad": Entry(
            "fedac.algorithms.fedopt:FedAdagrad",
            "FedAdagrad: Adagrad on the server over the mean update",
            _OPT,
            "fedopt",
        ),
        "fedavgm": Entry(
            "fedac.algorithms.fedopt:FedAvgM",
            "FedAvgM: server momentum over the mean update",
            _OPT,
            "fedopt",
        ),
        "fedmlac": Entry(
            "fedac.algorithms.fedmlac:FedMLAC",
            "FedMLAC: personalized models + a shared Plug-in by mutual learning, LPA aggregation",
            f"{_S}.fedmlac:FedMLACConfig",
            defaults=f"{_S}.fedmlac:RUN_DEFAULTS",
        ),
        "fedkad": Entry(
            "fedac.algorithms.fedkad:FedKAD",
            "FedKAD: heterogeneous client models aligned on shared prototypes",
            f"{_S}.fedkad:FedKADConfig",
        ),
        "fedkwsui": Entry(
            "fedac.algorithms.fedkwsui:FedKWSUI",
            "FedKWS-UI: adaptive label smoothing, adaptive local steps, a private head",
            f"{_S}.fedkwsui:FedKWSUIConfig",
            defaults=f"{_S}.fedkwsui:RUN_DEFAULTS",
        ),
        "fedmmd": Entry(
            "fedac.algorithms.fedmmd:FedMMD",
            "FedMMD: CE + MMD to the frozen global model's features",
            f"{_S}.fedmmd:FedMMDConfig",
            defaults=f"{_S}.fedmmd:RUN_DEFAULTS",
        ),
        "zeroshot": Entry(
            "fedac.algorithms.zeroshot:ZeroShotFL",
            "Zero-shot FL with new classes: score sharing, data impressions, k-medoids "
            "registration",
            f"{_S}.zeroshot:ZeroShotConfig",
            defaults=f"{_S}.zeroshot:RUN_DEFAULTS",
            finish=f"{_S}.zeroshot:finish",
        ),
        "earlyexit": Entry(
            "fedac.algorithms.earlyexit:EarlyExitFL",
            "Early-exit fine-tuning of SSL encoders: per-client depth, depth-weighted aggregation",
            f"{_S}.earlyexit:EarlyExitConfig",
        ),
        "fedbn": Entry(
            "fedac.algorithms.fedbn:FedBN",
            "FedBN: FedAvg whose BatchNorm layers stay on each client (personalised)",
            f"{_S}.fedbn:FedBNConfig",
        ),
        "fedper": Entry(
            "fedac.algorithms.fedper:FedPer",
            "FedPer: a shared body and a private head per client (personalised)",
        ),
        "fedrep": Entry(
            "fedac.algorithms.fedrep:FedRep",
            "FedRep: a private head trained first, then the shared body (personalised)",
            f"{_S}.fedrep:FedRepConfig",
        ),
        "lgfedavg": Entry(
            "fedac.algorithms.lgfedavg:LGFedAvg",
            "LG-FedAvg: a private body and a shared head per client (personalised)",
            f"{_S}.lgfedavg:LGFedAvgConfig",
        ),
        "local": Entry(
            "fedac.algorithms.local_only:Local",
            "Local training alone: each client its own model, nothing aggregated (personalised)",
        ),
        "central": Entry(
            "fedac.algorithms.central:Central",
            "Centralised training on one pooled client (warm-up + decay)",
            f"{_S}.central:CentralConfig",
        ),
        "scaffold": Entry(
            "fedac.algorithms.scaffold:Scaffold",
            "SCAFFOLD (option II): control variates correct every local gradient; trains stacked",
            f"{_S}.scaffold:ScaffoldConfig",
            defaults=f"{_S}.scaffold:RUN_DEFAULTS",
        ),
        "feddyn": Entry(
            "fedac.algorithms.feddyn:FedDyn",
            "FedDyn: a per-client dual term and the server's h / alpha correction; trains stacked",
            f"{_S}.feddyn:FedDynConfig",
            defaults=f"{_S}.feddyn:RUN_DEFAULTS",
        ),
        "moon": Entry(
            "fedac.algorithms.moon:Moon",
            "MOON: contrasts the global and the previous local model's embeddings; trains stacked",
            f"{_S}.moon:MoonConfig",
        ),
        "ditto": Entry(
            "fedac.algorithms.ditto:Ditto",
            "Ditto: FedAvg plus a personal model pulled towards the global one (lambda); stacked",
            f"{_S}.ditto:DittoConfig",
        ),
        "qffl": Entry(
            "fedac.algorithms.qffl:QFFL",
            "q-FFL (q-FedAvg): clients of larger loss weigh more, by F_k^q (Li et al. 2020)",
            f"{_S}.qffl:QFFLConfig",
        ),
        "afl": Entry(
            "fedac.algorithms.afl:AFL",
            "Agnostic FL: the worst mixture of clients, lambda by projected ascent (Mohri et al. "
            "2019)",
            f"{_S}.afl:AFLConfig",
        ),
        "term": Entry(
            "fedac.algorithms.term:TERM",
            "TERM: client models tilted by exp(t F_k) (Li et al. 2021)",
            f"{_S}.term:TERMConfig",
        ),
        "apfl": Entry(
            "fedac.algorithms.apfl:APFL",
            "APFL: personal mixture alpha v + (1 - alpha) w, alpha learned",
            f"{_S}.apfl:APFLConfig",
        ),
    },
)
