"""Flower run-config / node-config -> fedac settings.

The run-config keys (`[tool.flwr.app.config]` in pyproject.toml, overridable with
`flwr run . <link> --run-config 'rounds=5 fedac-set="data.root=/data/gsc;runtime.threads=1"'`) map
onto the fedac config:

    fedac-config   path of a fedac YAML config (e.g. a run directory's config.yaml); "" = defaults
    algorithm, dataset, seed, rounds (train.rounds), fraction (train.fraction), lr (train.lr)
    fedac-set      any other fedac settings, "key=value" pairs separated by ';' (`fedac run --set`)

with fedac's precedence: defaults < fedac-config < the named keys < fedac-set. The remaining keys
are the deployment's own: run-dir, strategy, min-nodes, round-timeout, node-wait, poll-interval,
data-mode, and secagg with its secagg-* parameters (`secagg_settings`).

Each SuperNode's node-config selects its client: `partition-id` (index into the clients that fedac's
partitioner makes from the config), `num-partitions` (checked against that count) and optionally
`data-root` (this device's copy of the dataset) and `cache-dir` (feature cache). With
`data-mode=device` (and the run's `data-mode=device`) a node holds only its own clips instead:
`data-root` is that folder, `partition-id` is not needed, and `data-layout`, `labels-csv`, `client`
and `test-root` describe it (see fedac.data.devices).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedac.config import DEVICE_SYNTAX, Config, load_config
from fedac.errors import ConfigError

if TYPE_CHECKING:  # (torch loads with the runtime, not with the settings)
    from fedac.training.runtime import Runtime

#: run-config key -> fedac setting.
RUN_CONFIG_KEYS = {
    "algorithm": "algorithm",
    "dataset": "dataset",
    "seed": "seed",
    "rounds": "train.rounds",
    "fraction": "train.fraction",
    "lr": "train.lr",
}


def split_overrides(text: str) -> list[str]:
    """'a.b=1; c.d=x' -> ['a.b=1', 'c.d=x'] (empty parts dropped)."""
    return [part.strip() for part in str(text).split(";") if part.strip()]


def fedac_config(run_config: Mapping[str, Any]) -> Config:
    """The fedac Config a Flower run describes (identical on the ServerApp and every ClientApp)."""
    path = str(run_config.get("fedac-config", "") or "").strip() or None
    flags = {}
    for key, setting in RUN_CONFIG_KEYS.items():
        value = run_config.get(key)
        if value is not None and value != "":
            flags[setting] = value
    return load_config(path, split_overrides(run_config.get("fedac-set", "")), **flags)


@dataclass
class DeploymentSettings:
    run_dir: Path | None
    """Where the ServerApp writes config.yaml / metrics.csv / results.json; None:
    runs/<time>-...-flower."""
    min_nodes: int = 2
    """SuperNodes that must be connected before a round is sampled (Flower's
    min_available_nodes)."""
    round_timeout: float = 600.0
    """Seconds the ServerApp waits for replies of one exchange; nodes that miss it are dropped from
    the round."""
    node_wait: float = 120.0
    """Seconds to wait for `min_nodes` SuperNodes before giving up with an error."""
    poll_interval: float = 0.5
    """Seconds between reply polls (Flower's Grid.send_and_receive sleeps 3 s)."""
    strategy: str = "fedac"
    """fedac: `FedacStrategy` (any algorithm, the simulator's cohorts); flower: Flower's built-in
    strategy of the same name (FedAvg-family algorithms only, Flower's random node sampling)."""
    data_mode: str = "full"
    """full: the server builds the run's partition and nodes pick their client by partition-id;
    device: the server holds only validation and test data and the clients are whatever device nodes
    connect."""
    secagg: SecAggSettings | None = None
    """run-config secagg=true: the uploads travel through Flower's SecAgg+ (fedac.flower.secagg)."""


def _number(run_config: Mapping[str, Any], key: str, default: float, kind: type) -> Any:
    value = run_config.get(key, default)
    try:
        out = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"run-config '{key}' expects {kind.__name__}, got {value!r}") from None
    if out < 0 or (kind is int and out < 1) or (key != "node-wait" and out == 0):
        raise ConfigError(f"run-config '{key}' must be positive, got {value!r}")
    return out


def deployment_settings(run_config: Mapping[str, Any]) -> DeploymentSettings:
    run_dir = str(run_config.get("run-dir", "") or "").strip()
    return DeploymentSettings(
        run_dir=Path(run_dir).expanduser() if run_dir else None,
        min_nodes=_number(run_config, "min-nodes", 2, int),
        round_timeout=_number(run_config, "round-timeout", 600.0, float),
        node_wait=_number(run_config, "node-wait", 120.0, float),
        poll_interval=_number(run_config, "poll-interval", 0.5, float),
        strategy=_choice(run_config, "strategy", ("fedac", "flower")),
        data_mode=_choice(run_config, "data-mode", DATA_MODES),
        secagg=secagg_settings(run_config),
    )


def _choice(run_config: Mapping[str, Any], key: str, options: tuple[str, ...]) -> str:
    value = str(run_config.get(key, options[0]) or options[0]).strip().lower()
    if value not in options:
        raise ConfigError(
            f"run-config '{key}' must be one of {', '.join(options)}, got {run_config.get(key)!r}"
        )
    return value


#: full: a copy of the dataset, client chosen by partition-id; device: the node's own clips
#: (data/devices.py).
DATA_MODES = ("full", "device")


@dataclass
class NodeSettings:
    partition_id: int | None
    num_partitions: int | None
    data_root: str | None
    cache_dir: str | None
    data_mode: str = "full"
    data_layout: str = "auto"
    """device mode: csv, folders, official or auto (see fedac.data.devices)."""
    labels_csv: str | None = None
    """device mode: the file,label table (default <data-root>/labels.csv)."""
    client: str | None = None
    """device mode: the client's name (default: the split-devices folder's, else node<node id>)."""
    test_root: str | None = None
    """device mode: a copy of the dataset whose test split the node's own model is scored on at the
    end."""
    device: str | None = None
    """node-config `device` (cpu, cuda, cuda:N): where this node trains, in place of the run's
    runtime.device (one SuperNode per GPU: `device="cuda:1"`; docs/flower.md)."""


def node_settings(node_config: Mapping[str, Any]) -> NodeSettings:
    mode = _node_choice(node_config, "data-mode", DATA_MODES)
    if mode == "device":
        return _device_node_settings(node_config)
    if "partition-id" not in node_config:
        raise ConfigError(
            "this SuperNode has no 'partition-id' in its node-config; start it with "
            '--node-config "partition-id=<k> num-partitions=<N>" (k in 0..N-1 selects fedac\'s '
            "k-th client)"
        )
    try:
        partition_id = int(node_config["partition-id"])
        num = node_config.get("num-partitions")
        num_partitions = None if num in (None, "") else int(num)
    except (TypeError, ValueError):
        raise ConfigError(
            f"node-config partition-id / num-partitions must be integers, got {dict(node_config)}"
        ) from None
    root = str(node_config.get("data-root", "") or "").strip() or None
    cache = str(node_config.get("cache-dir", "") or "").strip() or None
    return NodeSettings(partition_id, num_partitions, root, cache, device=_device(node_config))


def _node_choice(node_config: Mapping[str, Any], key: str, options: tuple[str, ...]) -> str:
    value = str(node_config.get(key, options[0]) or options[0]).strip().lower()
    if value not in options:
        raise ConfigError(
            f"node-config '{key}' must be one of {', '.join(options)}, got {node_config.get(key)!r}"
        )
    return value


def _text(node_config: Mapping[str, Any], key: str) -> str | None:
    return str(node_config.get(key, "") or "").strip() or None


def _device_node_settings(node_config: Mapping[str, Any]) -> NodeSettings:
    """A device node: its own folder (data-root, required), no partition-id needed (one is kept as a
    label)."""
    root = _text(node_config, "data-root")
    if root is None:
        raise ConfigError(
            "this SuperNode has data-mode=device but no data-root: start it with "
            '--node-config \'data-mode="device" data-root="/path/to/its/clips"\''
        )
    try:
        pid = node_config.get("partition-id")
        partition_id = None if pid in (None, "") else int(pid)
    except (TypeError, ValueError):
        raise ConfigError(
            f"node-config partition-id must be an integer, got {node_config.get('partition-id')!r}"
        ) from None
    return NodeSettings(
        partition_id,
        None,
        root,
        _text(node_config, "cache-dir"),
        "device",
        _node_choice(node_config, "data-layout", ("auto", "csv", "folders", "official")),
        _text(node_config, "labels-csv"),
        _text(node_config, "client"),
        _text(node_config, "test-root"),
        _device(node_config),
    )


def _device(node_config: Mapping[str, Any]) -> str | None:
    device = _text(node_config, "device")
    if device is not None and not DEVICE_SYNTAX.match(device):
        raise ConfigError(f"node-config device must be auto, cpu, cuda or cuda:N, got {device!r}")
    return device


def apply_node_settings(cfg: Config, node: NodeSettings) -> Config:
    """A node's own data location replaces the run's (the partitioning settings stay the run's). A
    device node's data-root is its own folder, not a dataset root: only its cache-dir applies. The
    node's device is no setting of the run: `node_runtime` takes it."""
    if node.data_root is not None and node.data_mode == "full":
        cfg.data.root = node.data_root
    if node.cache_dir is not None:
        cfg.data.cache_dir = node.cache_dir
    return cfg


def node_runtime(cfg: Config, node: NodeSettings) -> Runtime:
    """Where and how this node trains (training/runtime.py), resolved once: node-config `device` in
    place of the run's runtime.device, the run's other train.* settings; applies the process
    settings."""
    from fedac.training.device import resolve_device
    from fedac.training.runtime import start_runtime

    if node.device is None:
        return start_runtime(cfg.runtime)
    try:
        device = resolve_device(node.device)
    except ConfigError as err:
        raise ConfigError(f"node-config device={node.device}: {err}") from None
    return start_runtime(cfg.runtime, device)


@dataclass
class SecAggSettings:
    """Flower's SecAgg+ parameters (flwr.server.workflow.SecAggPlusWorkflow); see
    fedac.flower.secagg.

    Integers are counts, floats fractions, exactly as Flower reads them."""

    enabled: bool = False
    num_shares: int | float = 1.0
    """Shares of each client's secrets: an int > 2 is a count, a float the fraction of the round's
    cohort (1.0: every sampled client, i.e. the complete graph of SecAgg)."""
    threshold: int | float = 0.67
    """Shares needed to reconstruct a secret: an int is a count (< num_shares), a float the fraction
    of num_shares (Flower rounds it and takes at least 2). Lower tolerates more dropouts, higher
    resists more colluding clients."""
    clipping_range: float = 8.0
    """Each client's weighted update (n_k / max_weight) * (theta_k - theta) is clipped to [-C, C]
    per entry."""
    quantization_range: int = 4194304
    """Q: entries are stochastically quantized onto Q levels over [-C, C] (step 2C/Q); Flower's
    default 2**22."""
    max_weight: float = 0.0
    """W: client k's weight is n_k / W. 0 (the default): the largest n_k of each round's cohort."""


#: run-config key -> (SecAggSettings field, type); `secagg` itself switches it on.
SECAGG_KEYS = {
    "secagg-num-shares": "num_shares",
    "secagg-threshold": "threshold",
    "secagg-clipping-range": "clipping_range",
    "secagg-quantization-range": "quantization_range",
    "secagg-max-weight": "max_weight",
}


def secagg_settings(run_config: Mapping[str, Any]) -> SecAggSettings:
    """run-config `secagg` (true / false) and `secagg-*` -> SecAggSettings (checked further by
    Flower)."""
    flag = run_config.get("secagg", False)
    if isinstance(flag, str):
        if flag.strip().lower() not in ("true", "false", "1", "0", ""):
            raise ConfigError(f"run-config 'secagg' must be true or false, got {flag!r}")
        flag = flag.strip().lower() in ("true", "1")
    out = SecAggSettings(enabled=bool(flag))
    for key, name in SECAGG_KEYS.items():
        value = run_config.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"run-config '{key}' expects a number, got {value!r}")
        if name == "quantization_range" and (not isinstance(value, int) or value < 2):
            raise ConfigError(f"run-config '{key}' must be an integer >= 2, got {value!r}")
        if value < 0 or (value == 0 and name != "max_weight"):
            raise ConfigError(f"run-config '{key}' must be positive, got {value!r}")
        setattr(out, name, value)
    return out
