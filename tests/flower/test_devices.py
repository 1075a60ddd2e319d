"""Flower SuperNodes that hold only their own audio (issue 14): `fedac data split-devices`, the
device data source of the ClientApp (layouts, the run's label set, unknown labels and unreadable
files reported), the ServerApp holding only validation and test data, and a live SuperLink with 3
device SuperNodes whose FedMLAC run equals the simulator's.
"""

from __future__ import annotations

import csv
import json
import shutil
import time

import numpy as np
import pytest
import soundfile as sf
import torch

pytest.importorskip(
    "flwr", reason="flwr is not installed (pip install 'flwr>=1.41,<1.42'); Flower tests skipped"
)

from flwr.app import ConfigRecord, Context, MessageType, RecordDict  # noqa: E402

from fedac.cli import main  # noqa: E402
from fedac.config import load_config  # noqa: E402
from fedac.data import cremad, urbansound8k  # noqa: E402
from fedac.data.devices import DEVICE_INFO, LABELS_CSV, read_device  # noqa: E402
from fedac.data.partition import partition  # noqa: E402
from fedac.data.registry import load_manifest  # noqa: E402
from fedac.engine.data import build_federated_data  # noqa: E402
from fedac.engine.simulator import Simulator, sample_cohort  # noqa: E402
from fedac.errors import ConfigError, DatasetError  # noqa: E402
from fedac.flower import transport  # noqa: E402
from fedac.flower.settings import deployment_settings, fedac_config, node_settings  # noqa: E402
from flower_helpers import (
    PROCESS_WAIT,
    Federation,
    LocalGrid,
    assert_same_metrics,
    read_rows,
    use_task_identity,
)  # noqa: E402
from gsc_fixture import RATE, make_gsc_tree, word_tone  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

NUM_CLIENTS = 3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A tiny GSC tree (5 speakers, 1 clip per word), its feature cache, and split-devices folders
    for 3 IID clients."""
    root = make_gsc_tree(tmp_path_factory.mktemp("device_gsc"), speakers=5, clips=1)
    cache = tmp_path_factory.mktemp("device_cache")
    devices = tmp_path_factory.mktemp("devices") / "split"
    assert (
        main(
            [
                "data",
                "split-devices",
                "speech_commands",
                "--root",
                str(root),
                "--out",
                str(devices),
                "--quiet",
                *sum((["--set", s] for s in data_settings(root, cache)), []),
            ]
        )
        == 0
    )
    return root, cache, devices


def data_settings(root, cache, num_clients=NUM_CLIENTS):
    return [
        f"data.root={root}",
        f"data.cache_dir={cache}",
        "data.partition=iid",
        f"data.num_clients={num_clients}",
        "seed=3",
    ]


def run_config(dataset, run_dir, **extra):
    root, cache, _ = dataset
    settings = {
        "data.root": root,
        "data.cache_dir": cache,
        "data.partition": "iid",
        "data.num_clients": NUM_CLIENTS,
        "model.name": "crnn_tiny",
        "model.client_model": "crnn_tiny",
        "fedmlac.plugin_model": "crnn_tiny",
        "train.local_epochs": 1,
        "train.batch_size": 16,
        "train.momentum": 0.0,
        "runtime.threads": 1,
        "train.eval_every": 2,
    }
    config = {
        "algorithm": "fedmlac",
        "rounds": 2,
        "fraction": 1.0,
        "seed": 3,
        "lr": 0.05,
        "data-mode": "device",
        "fedac-set": ";".join(f"{k}={v}" for k, v in settings.items()),
        "run-dir": str(run_dir),
        "min-nodes": NUM_CLIENTS,
        "round-timeout": 600.0,
        "node-wait": PROCESS_WAIT,
        "poll-interval": 0.2,
    }
    config.update(extra)
    return config


def spoil(folder, root):
    """Give a device folder a clip with a label the run does not know and an undecodable clip (both
    listed)."""
    (folder / "dolphin").mkdir(exist_ok=True)
    sf.write(
        folder / "dolphin" / "click.wav",
        word_tone(3, 1, np.random.default_rng(0)),
        RATE,
        subtype="PCM_16",
    )
    (folder / "yes").mkdir(exist_ok=True)
    (folder / "yes" / "broken.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEnot audio at all")
    with open(folder / LABELS_CSV, "a", newline="") as handle:
        csv.writer(handle).writerows([["dolphin/click.wav", "dolphin"], ["yes/broken.wav", "yes"]])


# --- split-devices --------------------------------------------------------------------------------


def test_split_devices_writes_each_clients_clips_of_the_runs_partition(dataset, capsys):
    root, cache, devices = dataset
    cfg = load_config(None, data_settings(root, cache))
    manifest = load_manifest(cfg, progress=False)
    splits = partition(manifest, cfg.data, cfg.seed)
    assert sorted(p.name for p in devices.iterdir() if p.is_dir()) == [s.name for s in splits]
    for split in splits:
        folder = devices / split.name
        rows = read_rows(folder / LABELS_CSV)
        expected = [manifest.clips[i] for i in sorted(split.train + split.holdout)]
        # The client's clips, in manifest order, each under its label and byte for byte the
        # original.
        assert [r["file"] for r in rows] == [
            f"{manifest.classes[c.label]}/{c.path.rsplit('/', 1)[1]}" for c in expected
        ]
        assert [r["label"] for r in rows] == [manifest.classes[c.label] for c in expected]
        assert all(
            (folder / r["file"]).read_bytes() == open(c.path, "rb").read()
            for r, c in zip(rows, expected)
        )
        assert json.loads((folder / DEVICE_INFO).read_text())["client"] == split.name
    val_test = {c.path.rsplit("/", 1)[1] for c in manifest.clips if c.split != "train"}
    assert not val_test & {p.name for p in devices.rglob("*.wav")}
    # Same settings again: the folders are reused; a folder fedac did not write is refused.
    args = [
        "data",
        "split-devices",
        "speech_commands",
        "--root",
        str(root),
        "--out",
        str(devices),
        *sum((["--set", s] for s in data_settings(root, cache)), []),
    ]
    assert main(args) == 0 and f"{NUM_CLIENTS} clients" in capsys.readouterr().out
    foreign = devices.parent / "foreign"
    (foreign / splits[0].name).mkdir(parents=True)
    assert main([*args[:6], str(foreign), *args[7:]]) == 2
    assert "refusing to delete" in capsys.readouterr().err


def test_split_devices_cuts_slices_into_files_with_the_same_samples(dataset, tmp_path):
    """Speech Commands' _silence_ clips are 1 s slices of background-noise files: a device gets each
    as a file."""
    from fedac.data.audio import load_audio
    from fedac.data.devices import _copy_clip
    from fedac.data.manifest import Clip

    noise = dataset[0] / "_background_noise_" / "white_noise.wav"
    _copy_clip(
        Clip(str(noise), 0, "c", "train", offset=3.0, duration=1.0),
        tmp_path / "_silence_" / "w_3s.wav",
    )
    assert np.array_equal(
        load_audio(tmp_path / "_silence_" / "w_3s.wav"), load_audio(noise, offset=3.0, duration=1.0)
    )


# --- the device data source -----------------------------------------------------------------------


def test_device_reader_reports_unknown_labels_and_unreadable_files(dataset, tmp_path, caplog):
    root, cache, devices = dataset
    folder = tmp_path / "dev"
    cfg = load_config(None, data_settings(root, cache))
    classes = load_manifest(cfg, progress=False).classes
    # folders layout: <label>/<file>.wav, sorted by path; a label the run does not know and a broken
    # file skipped.
    for word in ("yes", "no"):
        (folder / word).mkdir(parents=True)
        for n in range(2):
            sf.write(
                folder / word / f"s{n}.wav",
                word_tone(classes.index(word), n, np.random.default_rng(n)),
                RATE,
            )
    spoil(folder, root)
    (folder / LABELS_CSV).unlink()
    manifest, report = read_device(folder, cfg, classes, "me")
    assert [c.path.rsplit("/", 2)[1:] for c in manifest.clips] == [
        ["no", "s0.wav"],
        ["no", "s1.wav"],
        ["yes", "s0.wav"],
        ["yes", "s1.wav"],
    ]
    assert [manifest.classes[c.label] for c in manifest.clips] == ["no", "no", "yes", "yes"]
    assert {c.client for c in manifest.clips} == {"me"} and {c.split for c in manifest.clips} == {
        "train"
    }
    assert report.files == 6 and dict(report.unknown) == {"dolphin": 1}
    assert len(report.corrupt) == 1 and "broken.wav: cannot decode" in report.corrupt[0]
    assert (
        "1 file(s) with labels the run does not know: dolphin (1)" in caplog.text
        and "1 unreadable file(s)" in caplog.text
    )
    # csv layout: its row order is the clip order; a listed file that is missing is reported, not
    # fatal.
    (folder / LABELS_CSV).write_text(
        "file,label\nyes/s1.wav,yes\nno/s0.wav,no\nno/gone.wav,no\ndolphin/click.wav,dolphin\n"
    )
    manifest, report = read_device(folder, cfg, classes, "me")
    assert [c.path.rsplit("/", 2)[1:] for c in manifest.clips] == [
        ["yes", "s1.wav"],
        ["no", "s0.wav"],
    ]
    assert report.missing == [str(folder / "no" / "gone.wav")] and dict(report.unknown) == {
        "dolphin": 1
    }
    # official layout of the 12-class task: word folders outside the 10 words become _unknown_.
    cfg12 = load_config(None, [*data_settings(root, cache), "data.task=12"])
    (folder / "bed").mkdir()
    sf.write(
        folder / "bed" / "0000000a_nohash_0.wav", word_tone(1, 1, np.random.default_rng(1)), RATE
    )
    classes12 = [*"yes no up down left right on off stop go".split(), "_silence_", "_unknown_"]
    manifest, report = read_device(folder, cfg12, classes12, "me", layout="official")
    assert [(c.path.rsplit("/", 1)[1], classes12[c.label]) for c in manifest.clips] == [
        ("0000000a_nohash_0.wav", "_unknown_"),
        ("s0.wav", "no"),
        ("s1.wav", "no"),
        ("s0.wav", "yes"),
        ("s1.wav", "yes"),
    ]
    assert dict(report.unknown) == {"dolphin": 1} and len(report.corrupt) == 1
    # official layouts of CREMA-D and UrbanSound8K: labels parsed from the file names (DIS is not a
    # class).
    tone = word_tone(2, 0, np.random.default_rng(2))
    for name in (
        "AudioWAV/1001_DFA_ANG_XX.wav",
        "AudioWAV/1002_IEO_DIS_HI.wav",
        "AudioWAV/notes.wav",
        "audio/fold1/100-3-0-0.wav",
        "audio/fold2/7-9-1-2.wav",
    ):
        (tmp_path / "official" / name).parent.mkdir(parents=True, exist_ok=True)
        sf.write(tmp_path / "official" / name, tone, RATE)
    manifest, report = read_device(
        tmp_path / "official", load_config(None, ["dataset=cremad"]), cremad.CLASSES, "me"
    )
    assert [(c.path.rsplit("/", 1)[1], c.label) for c in manifest.clips] == [
        ("1001_DFA_ANG_XX.wav", 0)
    ]
    assert dict(report.unknown) == {"DIS": 1, "(unparsed file name)": 1}
    manifest, _ = read_device(
        tmp_path / "official",
        load_config(None, ["dataset=urbansound8k"]),
        urbansound8k.CLASSES,
        "me",
    )
    assert [(c.path.rsplit("/", 1)[1], c.label) for c in manifest.clips] == [
        ("100-3-0-0.wav", 3),
        ("7-9-1-2.wav", 9),
    ]
    # Bad input: typed errors naming the folder / setting and the fix.
    with pytest.raises(DatasetError, match=r"holds no usable clip .* labels of the run: a, b"):
        read_device(folder, cfg, ["a", "b"], "me", layout="folders")
    with pytest.raises(DatasetError, match="device data folder .*nowhere.* does not exist"):
        read_device(tmp_path / "nowhere", cfg, classes, "me")
    with pytest.raises(
        ConfigError, match="data-layout=official is not available for dataset 'iemocap'"
    ):
        read_device(
            folder, load_config(None, ["dataset=iemocap"]), classes, "me", layout="official"
        )


def test_device_node_settings():
    node = node_settings(
        {"data-mode": "device", "data-root": "/clips", "data-layout": "CSV", "client": "kitchen"}
    )
    assert (node.data_mode, node.data_root, node.data_layout, node.client, node.partition_id) == (
        "device",
        "/clips",
        "csv",
        "kitchen",
        None,
    )
    with pytest.raises(ConfigError, match="data-mode=device but no data-root"):
        node_settings({"data-mode": "device"})
    with pytest.raises(ConfigError, match="node-config 'data-mode' must be one of full, device"):
        node_settings({"data-mode": "phone"})
    assert deployment_settings({"data-mode": "device"}).data_mode == "device"
    with pytest.raises(ConfigError, match="run-config 'data-mode' must be one of full, device"):
        deployment_settings({"data-mode": "phone"})


def test_directory_of_device_nodes_logs_joins_and_leaves_and_orders_clients_by_name(caplog):
    from fedac.flower.strategy import FlowerRunError, NodeDirectory

    class Grid:
        ids = [5, 6]

        def get_node_ids(self):
            return self.ids

    caplog.set_level("INFO", logger="fedac")
    grid, directory = Grid(), NodeDirectory([], min_nodes=1, open_roster=True)
    directory.refresh(grid, identify=False)
    directory.learn(6, {"client": "zeta", "partition-id": -1, "num-examples": 3})
    directory.learn(
        5, {"client": "alpha", "partition-id": -1, "num-examples": 4, "skipped-corrupt": 2}
    )
    assert directory.order == {"alpha": 0, "zeta": 1}  # the simulator's client order: by name
    assert (
        "node 5 (client alpha) skipped files on its device: 0 with labels the run does not know "
        "(-), 2 unreadable" in caplog.text
    )
    grid.ids = [6, 7]
    live, unidentified = directory.refresh(grid, identify=False)
    assert (
        "node 5 (client alpha) left the federation" in caplog.text
        and "node 7 connected" in caplog.text
    )
    assert [n.client for n in live] == ["zeta"] and unidentified == [7]
    with pytest.raises(FlowerRunError, match="nodes 6 and 7 both hold client zeta"):
        directory.learn(7, {"client": "zeta", "partition-id": -1, "num-examples": 1})
    with pytest.raises(
        FlowerRunError, match="holds client 'zeta', which the ServerApp's config does not make"
    ):
        NodeDirectory(["alpha"]).learn(6, {"client": "zeta", "partition-id": 0, "num-examples": 3})


# --- in process: the ServerApp and device ClientApps on a LocalGrid -------------------------------


@pytest.mark.slow
def test_in_process_fedkad_device_nodes_equal_the_simulator(dataset, tmp_path, monkeypatch, caplog):
    """FedKAD (its own models, no global model) on device nodes in one process (a LocalGrid): each
    node reads only its split-devices folder (and, for the final personalized test score, a copy of
    the dataset's test split via test-root); the server builds no partition. Metrics, personalized
    results and the own models kept in each node's context.state equal the simulator's, label errors
    included; a fourth node whose folder holds no usable clip is named and left out. (FedMLAC: the
    live test below.)"""
    from fedac.engine import data as engine_data
    from fedac.flower import clientapp, serverapp

    use_task_identity(monkeypatch)
    caplog.set_level("INFO", logger="fedac")
    devices = dataset[2]
    config = run_config(
        dataset, tmp_path / "run", algorithm="fedkad", fraction=0.5, **{"poll-interval": 0.01}
    )
    # label errors drawn on the device too
    config["fedac-set"] += ";train.eval_every=1;data.label_error=0.3"
    # Nodes in reverse client order: the server orders the clients by name, as the simulator does.
    nodes = {
        200 + k: {
            "data-mode": "device",
            "data-root": str(devices / f"client{NUM_CLIENTS - 1 - k:03d}"),
            "test-root": str(dataset[0]),
        }
        for k in range(NUM_CLIENTS)
    }
    useless = tmp_path / "useless" / "dolphin"
    useless.mkdir(parents=True)
    shutil.copy(next(devices.glob("client000/*/*.wav")), useless / "click.wav")
    nodes[299] = {"data-mode": "device", "data-root": str(useless.parent)}
    grid = LocalGrid(clientapp.app, nodes, config)
    cfg = fedac_config(config)
    (tmp_path / "run").mkdir()
    cached = set((dataset[1] / "features").glob("device-*.pt"))
    with monkeypatch.context() as patch:
        patch.setattr(
            engine_data,
            "partition",
            lambda *a, **k: pytest.fail("the device-mode server partitioned the data"),
        )
        results = serverapp.run_deployment(grid, cfg, deployment_settings(config), tmp_path / "run")
    assert (
        "node 299 could not load its fedac client" in caplog.text
        and "holds no usable clip" in caplog.text
    )
    cfg.runtime.execution = (
        "sequential"  # the ClientApp's path (the stacked one reorders float sums)
    )
    sim = Simulator(cfg, tmp_path / "sim", progress=False)
    expected = sim.run()
    assert results["clients"] == NUM_CLIENTS
    # Features were computed on and cached for each device, from its own clips.
    assert (
        len(set((dataset[1] / "features").glob("device-speech_commands-mfcc-*.pt")) - cached)
        == NUM_CLIENTS
    )
    for key in ("personalized_accuracy_mean", "personalized_local_accuracy_mean"):
        assert results["final"][key] == pytest.approx(expected["final"][key], abs=1e-6), key
    assert_same_metrics(
        tmp_path / "run" / "metrics.csv", tmp_path / "sim" / "metrics.csv", rounds=2
    )
    # Partial participation: new nodes were asked who they are (with the label set), cohorts are the
    # simulator's.
    queries = [m for m in grid.sent if m.metadata.message_type == MessageType.QUERY]
    # 299: asked again each round
    assert sorted(m.metadata.dst_node_id for m in queries) == [200, 201, 202, 299, 299]
    log = json.loads((tmp_path / "run" / "flower_clients.json").read_text())
    for round_idx in (1, 2):
        assert [r["client"] for r in log["rounds"][str(round_idx)]] == sample_cohort(
            [c.name for c in sim.data.clients], 0.5, cfg.seed, round_idx
        )
    # The personalized state lives in each node's context.state, under its split-devices client
    # name.
    for node_id, context in grid.contexts.items():
        if node_id == 299:
            continue
        info = context.state.config_records["fedac.state-info"]
        state = transport.get(context.state, "fedac.state")
        assert transport.digest(state) == transport.digest(sim.state.clients[str(info["client"])])


def test_device_mode_errors_reach_the_operator(dataset, tmp_path):
    from fedac.flower import clientapp

    _, _, devices = dataset
    config = run_config(dataset, tmp_path / "run")
    context = Context(
        run_id=7,
        node_id=5,
        node_config={"data-mode": "device", "data-root": str(devices / "client000")},
        state=RecordDict(),
        run_config=config,
    )
    with pytest.raises(ConfigError, match='submit the run with run-config data-mode="device"'):
        clientapp.node_client(context, RecordDict({"config": ConfigRecord({"server-round": 1})}))
    # Without a device.json or node-config client, the node is its node id.
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("yes", "no"):
        (bare / name).mkdir()
        source = next((devices / "client000").glob(f"{name}/*.wav"), None) or next(
            (devices / "client001").glob(f"{name}/*.wav")
        )
        (bare / name / source.name).write_bytes(source.read_bytes())
    context.node_config["data-root"] = str(bare)
    classes = build_federated_data(fedac_config(config), progress=False).manifest.classes
    node = clientapp.node_client(
        context, RecordDict({"config": ConfigRecord({"classes": classes})})
    )
    assert node.client.name == "node5" and node.info["data-mode"] == "device"
    assert sorted(c.path for c in node.data.manifest.clips) == sorted(
        str(p) for p in bare.rglob("*.wav")
    )
    assert node.data.test is None  # no test-root: no test split on the node
    # node-config client names the client; labels-csv picks the table (here: only the "no" clip).
    (tmp_path / "mine.csv").write_text(
        "file,label\n" + "".join(f"{p.relative_to(bare)},no\n" for p in bare.glob("no/*.wav"))
    )
    context.node_config.update({"client": "kitchen", "labels-csv": str(tmp_path / "mine.csv")})
    node = clientapp.node_client(
        context, RecordDict({"config": ConfigRecord({"classes": classes})})
    )
    assert node.client.name == "kitchen" and [c.path for c in node.data.manifest.clips] == [
        str(p) for p in bare.glob("no/*.wav")
    ]
    # Attacks choose their malicious clients over the full client list, which a device run lacks:
    # refused on the node and on the server, never silently applied to nobody.
    context.run_config = run_config(
        dataset, tmp_path / "run", **{"fedac-set": config["fedac-set"] + ";attack.kind=sign_flip"}
    )
    with pytest.raises(ConfigError, match="attack.kind=sign_flip cannot run with data-mode=device"):
        clientapp.node_client(context, RecordDict({"config": ConfigRecord({"classes": classes})}))
    from fedac.flower.serverapp import run_deployment
    from fedac.flower.settings import deployment_settings

    with pytest.raises(ConfigError, match="cannot run with data-mode=device"):
        run_deployment(
            None,
            fedac_config(context.run_config),
            deployment_settings(context.run_config),
            tmp_path / "srv",
        )
    # DP's accountant needs the sampling rate cohort / clients, which a device-mode server cannot
    # know.
    context.run_config = run_config(
        dataset,
        tmp_path / "run",
        **{"fedac-set": config["fedac-set"] + ";dp.mode=central;fedmlac.lpa=false"},
    )
    with pytest.raises(ConfigError, match="this server holds no clients"):
        run_deployment(
            None,
            fedac_config(context.run_config),
            deployment_settings(context.run_config),
            tmp_path / "srv",
        )


# --- live: a SuperLink and 3 device SuperNodes ----------------------------------------------------


@pytest.mark.slow
def test_live_device_supernodes_equal_the_simulator(dataset, tmp_path_factory, capsys):
    """3 SuperNodes, each given only its own split-devices folder; client000's folder also lists a
    clip with a label the run does not know and an undecodable one. FedMLAC, 2 rounds: the server
    reports both skips, each node's manifest holds only its folder's files, and the results equal
    the simulator's."""
    root, cache, devices = dataset
    folders = {k: tmp_path_factory.mktemp("live") / f"client{k:03d}" for k in range(NUM_CLIENTS)}
    for k, folder in folders.items():
        shutil.copytree(devices / f"client{k:03d}", folder)
    spoil(folders[0], root)
    node_config = {k: f'data-mode="device" data-root="{folder}"' for k, folder in folders.items()}
    fed = Federation(tmp_path_factory.mktemp("device_federation"), NUM_CLIENTS, node_config)
    run_dir = tmp_path_factory.mktemp("device_run") / "run"
    config = run_config(dataset, run_dir)
    cfg = fedac_config(config)
    build_federated_data(cfg, progress=False)  # fill the server's val / test feature cache
    started = time.perf_counter()
    try:
        fed.start()
        fed.run(config, name="flwr-run-devices")
        seconds = time.perf_counter() - started
        results = json.loads((run_dir / "results.json").read_text())
        assert (
            results["rounds"] == 2
            and results["clients"] == NUM_CLIENTS
            and not results["runtime"]["dropped"]
        )
        log = json.loads((run_dir / "flower_clients.json").read_text())
        by_client = {r["client"]: r for r in log["rounds"]["2"]}
        assert sorted(by_client) == [f"client{k:03d}" for k in range(NUM_CLIENTS)]
        # Both skips reported by client000's node, in the server's log and in flower_clients.json.
        assert (
            by_client["client000"]["skipped-unknown"] == 1
            and by_client["client000"]["unknown-labels"] == "dolphin (1)"
        )
        assert by_client["client000"]["skipped-corrupt"] == 1
        assert all(by_client[f"client{k:03d}"]["skipped-unknown"] == 0 for k in (1, 2))
        server_log = (run_dir / "server.log").read_text()
        assert (
            "skipped files on its device: 1 with labels the run does not know (dolphin (1)), 1 "
            "unreadable" in server_log
        )
        # Each node's manifest: exactly the readable, known-label files of its own folder (the node
        # logs them).
        for k, folder in folders.items():
            listed = [r["file"] for r in read_rows(devices / f"client{k:03d}" / LABELS_CSV)]
            node_log = fed.logs[f"node{k}"].read_text(errors="replace")
            assert f"device client{k:03d}: {len(listed)} clips in {folder} (" in node_log
            assert by_client[f"client{k:03d}"]["files"] == len(listed) + (2 if k == 0 else 0)
        # Equal to the simulator on the same partition (the tolerance of
        # tests/flower/test_flower.py). the ClientApp's path (the stacked one reorders float sums)
        cfg.runtime.execution = "sequential"
        sim = Simulator(cfg, tmp_path_factory.mktemp("device_sim"), progress=False)
        expected = sim.run()
        flower_params = torch.load(run_dir / "server_state.pt")["params"]
        for name, value in sim.state.server["params"].items():
            torch.testing.assert_close(
                flower_params[name], value, rtol=0, atol=1e-5, msg=f"Plug-in parameter {name}"
            )
        for client, report in by_client.items():
            assert report["new-state-digest"] == transport.digest(sim.state.clients[client]), client
        for key in ("accuracy", "macro_f1"):
            assert results["final"][key] == pytest.approx(expected["final"][key], abs=1e-6), key
        # the nodes hold no test split (no test-root)
        assert "personalized_accuracy_mean" not in results["final"]
        sim_row, row = (
            read_rows(sim.run_dir / "metrics.csv")[-1],
            read_rows(run_dir / "metrics.csv")[-1],
        )
        for key in (
            "clients",
            "train_loss",
            "val_accuracy",
            "local_accuracy",
            "lpa_trusted_fraction",
        ):
            assert float(row[key]) == pytest.approx(float(sim_row[key]), abs=1e-6), key
    except BaseException:
        print(fed.output())
        raise
    finally:
        fed.stop()
    with capsys.disabled():
        print(
            f"\n[flower devices] SuperLink + 3 device SuperNodes, 2-round FedMLAC: {seconds:.1f} s"
        )
