"""A Flower federation on loopback for tests: one SuperLink and N SuperNodes started and stopped by
PID.

Every process runs in its own session (so its SuperExec / ClientApp children can be found and ended
with it), writes its output to a log file in the federation's folder, and `FLWR_HOME` points into
that folder so nothing is written to the user's home. Ports are picked free by binding port 0.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fedac.flower.local import descendants, free_port, send_signal

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


# How long a test waits on a Flower process (a SuperLink's start-up, a `flwr run`) before failing
# with every log printed. Only a safety net against a hang: a loaded 2-core machine stretches
# start-ups and training several-fold, so it is far above what a healthy run needs; tests wait for
# events (a log line, an exit).
PROCESS_WAIT = 900.0


class Federation:
    def __init__(self, folder: Path, num_nodes: int, node_config: dict[int, str] | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.home = self.folder / "flwr_home"
        self.home.mkdir(exist_ok=True)
        self.port = free_port()
        self.num_nodes = num_nodes
        self.node_config = node_config or {
            k: f"partition-id={k} num-partitions={num_nodes}" for k in range(num_nodes)
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.env = {
            **os.environ,
            # flower-superexec, flwr-serverapp ...
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_HOME": str(self.home),
            # caches of the apps stay in the test's folder
            "FEDAC_HOME": str(self.folder / "fedac_home"),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
            "PYTHONUNBUFFERED": "1",
        }
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = '
            f'"127.0.0.1:{self.port}"\ninsecure = true\n'
        )

    # --- processes ------------------------------------------------------------------------------
    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.folder / f"{name}.log"
        handle = open(log, "wb")
        proc = subprocess.Popen(
            args,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.folder,
            start_new_session=True,
        )
        handle.close()
        self.procs[name], self.logs[name] = proc, log
        return proc

    def start(self, timeout: float = PROCESS_WAIT) -> None:
        self._start(
            "superlink",
            [
                str(BIN / "flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
        )
        self.wait_for(self._healthy, timeout, "the SuperLink's /health to answer")
        for k in range(self.num_nodes):
            self._start(
                f"node{k}",
                [
                    str(BIN / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    self.node_config[k],
                ],
            )
        self.wait_for(
            lambda: all(self.node_id(k) is not None for k in range(self.num_nodes)),
            timeout,
            "every SuperNode to register",
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/health", timeout=2
            ) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_for(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for name, proc in self.procs.items():
                if proc.poll() is not None and not name.startswith("killed"):
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} while waiting for "
                        f"{what}\n{self.output()}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"timed out after {timeout:.0f} s waiting for {what}\n{self.output()}"
                )
            time.sleep(0.2)

    def node_id(self, k: int) -> int | None:
        """The SuperNode ID node k logged when it registered."""
        match = re.search(r"SuperNode ID: (\d+)", self.logs[f"node{k}"].read_text(errors="replace"))
        return int(match.group(1)) if match else None

    def kill_node(self, k: int) -> None:
        """SIGKILL node k and everything it started (a crash: no goodbye to the SuperLink)."""
        proc = self.procs.pop(f"node{k}")
        for pid in [proc.pid, *descendants(proc.pid)]:
            send_signal(pid, signal.SIGKILL)
        proc.wait(timeout=60)
        self.procs[f"killed-node{k}"] = proc

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM each started process and its descendants, SIGKILL what is left after `grace`
        seconds."""
        procs = list(self.procs.values())
        family = {p.pid: descendants(p.pid) for p in procs}
        for proc in reversed(procs):
            for pid in [proc.pid, *family[proc.pid]]:
                send_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            for pid in [proc.pid, *family[proc.pid], *descendants(proc.pid)]:
                send_signal(pid, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    # --- runs -----------------------------------------------------------------------------------
    def submit(self, run_config: dict, name: str = "run") -> tuple[subprocess.Popen, Path]:
        """Start `flwr run <repo> loopback --stream` with the given run-config (as a TOML file)."""
        toml = self.folder / f"{name}.toml"
        toml.write_text("".join(f"{key} = {_toml(value)}\n" for key, value in run_config.items()))
        proc = self._start(
            name,
            [
                str(BIN / "flwr"),
                "run",
                str(REPO),
                "loopback",
                "--run-config",
                str(toml),
                "--stream",
            ],
        )
        self.procs.pop(name)  # a client process, not a server: waited for, not stopped
        self.submitted = proc
        return proc, self.logs[name]

    def run(self, run_config: dict, name: str = "run", timeout: float = PROCESS_WAIT) -> str:
        proc, log = self.submit(run_config, name)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            send_signal(proc.pid, signal.SIGKILL)
            proc.wait()
            raise TimeoutError(
                f"flwr run did not finish within {timeout:.0f} s\n{self.output()}"
            ) from None
        text = log.read_text(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"flwr run exited with {proc.returncode}\n{self.output()}")
        return text

    def output(self, tail: int = 6000) -> str:
        """The last `tail` characters of every log (printed when a test fails)."""
        parts = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"----- {name} ({path}) -----\n{text[-tail:]}")
        return "\n".join(parts)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class LocalGrid:
    """An in-process stand-in for the ServerApp's Grid: each node is a Context served by the
    ClientApp directly (no SuperLink, no processes), so the ServerApp's logic can be tested in
    milliseconds. Nodes listed in `dead` never answer (as a crashed SuperNode)."""

    def __init__(self, client_app, node_configs: dict[int, dict], run_config: dict):
        from flwr.app import Context, RecordDict

        self.app = client_app
        self.contexts = {
            node_id: Context(
                run_id=1,
                node_id=node_id,
                node_config=config,
                state=RecordDict(),
                run_config=run_config,
            )
            for node_id, config in node_configs.items()
        }
        self.dead: set[int] = set()
        self.sent: list = []
        self._pending: dict[str, object] = {}

    # the Grid interface the ServerApp uses
    def get_node_ids(self):
        return sorted(self.contexts)

    def push_messages(self, messages):
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id
            self._pending[message.metadata.message_id] = message
            self.sent.append(message)
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        from flwr.app import Error, Message

        replies = []
        for message_id in list(message_ids):
            message = self._pending.pop(message_id, None)
            if message is None:
                continue
            node_id = message.metadata.dst_node_id
            if node_id in self.dead:
                self._pending[message_id] = message
                continue
            try:
                replies.append(self.app(message, self.contexts[node_id]))
            except Exception as exc:  # what a SuperNode reports for a ClientApp that raised
                replies.append(Message(Error(2, f"{type(exc).__name__}: {exc}"), reply_to=message))
        return replies

    def send_and_receive(self, messages, *, timeout=None):
        ids = self.push_messages(list(messages))
        return self.pull_messages(ids)


def use_task_identity(monkeypatch) -> None:
    """Messages built outside a Flower process need the identity a ServerApp process gets from its
    SuperLink."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


def read_rows(path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def assert_same_metrics(run_csv, sim_csv, rounds: int) -> None:
    """metrics.csv of a Flower run equals the simulator's, row by row, every column but wall time
    (to 1e-6)."""
    import pytest

    rows, sim_rows = read_rows(run_csv), read_rows(sim_csv)
    assert len(rows) == len(sim_rows) == rounds
    for row, sim_row in zip(rows, sim_rows):
        for key in sim_row:
            if key != "wall_seconds":
                assert float(row[key]) == pytest.approx(float(sim_row[key]), abs=1e-6), key
