# fedac_example/entries.py
"""What the entry points name: one registry entry per part. fedac reads this module to list the
parts and to check settings before torch loads, so it imports no torch; each part's code loads when
a run uses it."""

from fedac.registry import Entry
from fedac.settings.codecs import CodecSpec
from fedac.settings.datasets import DatasetSpec

ALGORITHM = Entry(
    "fedac_example.algorithm:FedAvgLR",
    "FedAvg with a server learning rate (example plug-in)",
    settings="fedac_example.settings:FedAvgLRSettings",
)
SCAFFOLD = Entry(
    "fedac_example.scaffold:Scaffold",
    "SCAFFOLD option II, trains stacked (example plug-in)",
    defaults={"train.momentum": 0.0},
)
MODEL = Entry(
    "fedac_example.model:build", "time-averaged features, then a two-layer MLP (example plug-in)"
)
DATASET = DatasetSpec(
    "fedac_example.dataset:load_manifest",
    "fedac_example.dataset:generate",
    "natural",
    "pure tones, one pitch per class, one client per timbre (example plug-in)",
    synth_command="synth-tones",
)
AGGREGATOR = Entry(
    "fedac_example.aggregator:drop_farthest",
    "the mean without the uploads farthest from it (example plug-in)",
    settings="fedac_example.settings:DropFarthestSettings",
)
ATTACK = Entry(
    "fedac_example.attack:FreeRider", "uploads the global model unchanged (example plug-in)"
)
AVAILABILITY = Entry(
    "fedac_example.availability:office_hours",
    "online 8 h a virtual day from 9, 10 or 11 o'clock (example plug-in)",
)
CODEC = CodecSpec(
    "fedac_example.codec:ScaledSign",
    "per tensor its mean magnitude and one sign bit per entry (example plug-in)",
    quantised=True,
)
