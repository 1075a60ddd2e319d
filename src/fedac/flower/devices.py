"""Device mode of the ClientApp: a SuperNode that holds only its own audio (node-config
`data-mode=device`).

The node never sees the global partition. Its client is its folder: the clips listed or found there
(fedac.data.devices), labelled in the run's label set that the server sends with every message,
features computed and cached on the node with the run's settings, the local hold-out drawn over the
clips in their order as the simulator draws it (`holdout_split`). The client's name is node-config
`client`, else the name `fedac data split-devices` wrote into the folder's device.json, else
`node<node id>`; it seeds the client's batches, dropout and initial personalized model exactly as a
simulated client's name does.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Context, RecordDict

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import Algorithm, ClientData, Task
from fedac.config import Config
from fedac.data.devices import device_client_name, read_device
from fedac.engine.data import FederatedData, build_device_client, build_eval_data
from fedac.errors import ConfigError, DatasetError
from fedac.flower.settings import NodeSettings, apply_node_settings, fedac_config, node_runtime
from fedac.flower.strategy import CONFIG

log = logging.getLogger("fedac.flower")

#: Message config key with the run's class names (sent by the ServerApp with every message).
CLASSES = "classes"


@dataclass
class DeviceClient:
    cfg: Config
    data: FederatedData
    """The device's one client; val / test only when the node was given a test-root."""
    algorithm: Algorithm
    client: ClientData
    info: dict[str, Any] = field(default_factory=dict)
    """What the node reports about its folder (files, skipped unknown labels / unreadable files)."""


def run_classes(content: RecordDict) -> list[str]:
    """The run's label set from a server message."""
    config = content.config_records.get(CONFIG)
    if config is None or CLASSES not in config:
        raise ConfigError(
            "this SuperNode runs with data-mode=device, but the server's message carries no label "
            'set: submit the run with run-config data-mode="device"'
        )
    return [str(name) for name in config[CLASSES]]


def refuse_attacks_on_devices(cfg: Config) -> None:
    """attacks.py picks its malicious clients by a seeded choice over the whole federation's client
    list, which neither a device node nor a device-mode server holds: refuse instead of silently
    attacking nobody."""
    if cfg.attack.kind != "none":
        raise ConfigError(
            f"attack.kind={cfg.attack.kind} cannot run with data-mode=device: the malicious "
            "clients are a seeded choice over the federation's full client list, which a device "
            "deployment does not have; use the simulator or data-mode=full (the lab shortcut)"
        )


def device_client(context: Context, node: NodeSettings, classes: list[str]) -> DeviceClient:
    cfg = apply_node_settings(fedac_config(context.run_config), node)
    refuse_attacks_on_devices(cfg)
    runtime = node_runtime(cfg, node)
    assert node.data_root is not None  # device mode: node_settings requires data-root
    name = node.client or device_client_name(node.data_root) or f"node{context.node_id}"
    manifest, report = read_device(
        node.data_root, cfg, classes, name, node.data_layout, node.labels_csv
    )
    client = build_device_client(cfg, manifest, name, device=runtime.device)
    val = test = None
    if node.test_root is not None:
        test_cfg = copy.deepcopy(cfg)
        test_cfg.data.root = node.test_root
        split = build_eval_data(test_cfg, progress=False, device=runtime.device)
        if split.manifest.classes != classes:
            raise DatasetError(
                f"node-config test-root={node.test_root} gives the classes "
                f"{split.manifest.classes}, but the run's are {classes}: point test-root at a copy "
                "of the run's dataset"
            )
        val, test = split.val, split.test
    task = Task(int(client.x.shape[1]), len(classes), [name])
    data = FederatedData(task, manifest, [client], val, test)
    info = {
        "data-mode": "device",
        "files": report.files,
        "skipped-unknown": sum(report.unknown.values()),
        "unknown-labels": ", ".join(f"{k} ({n})" for k, n in sorted(report.unknown.items())),
        "skipped-corrupt": len(report.corrupt),
        "skipped-missing": len(report.missing),
    }
    log.info(
        "device %s: %d clips in %s (%d training, %d held out)%s",
        name,
        len(manifest.clips),
        node.data_root,
        client.num_samples,
        int(client.holdout_y.shape[0]),
        f"; skipped {report.summary()}" if report.summary() else "",
    )
    return DeviceClient(cfg, data, build_algorithm(cfg, task, runtime), client, info)
