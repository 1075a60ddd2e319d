"""Running Flower on this machine: free ports, process trees, and the SuperLink that `flwr run`
leaves.

`flwr run` with a connection whose address is `:local:` starts a detached SuperLink (and, through
it, the simulation runtime and Ray) and leaves it running after the run; `stop_local_superlink`
stops it and everything it started. Linux only (reads /proc).
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """All descendants of `pid` (read from /proc), deepest last."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile, or unreadable
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def send_signal(pid: int, sig: int) -> bool:
    """`os.kill` that tolerates a process already gone; True when the signal was delivered."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def stop_local_superlink(port: int) -> int:
    """SIGKILL the `flower-superlink` serving `port` (its HTTP API port) and all its descendants;
    returns how many processes were signalled (0: none was running)."""
    stopped = 0
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if any(b"flower-superlink" in a for a in args) and str(port).encode() in args:
            pid = int(entry.name)
            stopped += sum(
                send_signal(victim, signal.SIGKILL) for victim in [pid, *descendants(pid)]
            )
    return stopped
