import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The tests mirror the package's folders; a test module imports another's helpers by its base name
# (`from test_cohort import ...`), as pytest's default import mode names it, so each folder is on
# the path.
sys.path[1:1] = [
    str(p)
    for p in sorted(Path(__file__).parent.iterdir())
    if p.is_dir() and any(p.glob("test_*.py"))
]

from gsc_fixture import make_gsc_tree  # noqa: E402
from helpers import terminal_process_state  # noqa: E402


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`-n auto`, `--dist loadgroup`), each Flower test module runs on one
    worker: its live federation (a SuperLink and SuperNodes, module-scoped) then starts once, not
    once per worker, and the modules themselves still spread over the workers."""
    for item in items:
        path = Path(item.fspath)
        if path.parent.name == "flower":
            item.add_marker(pytest.mark.xdist_group(f"flower-{path.stem}"))


@pytest.fixture(autouse=True)
def fedac_home(tmp_path_factory, monkeypatch):
    """Caches of every test go to a temporary FEDAC_HOME, never the user's home."""
    home = tmp_path_factory.getbasetemp() / "fedac_home"
    monkeypatch.setenv("FEDAC_HOME", str(home))
    # Every run of the suite (runtime.device=auto, subprocesses included) on $FEDAC_TEST_DEVICE: the
    # CPU by default, so a GPU machine runs the same equality tests on CUDA with
    # FEDAC_TEST_DEVICE=cuda.
    monkeypatch.setenv("FEDAC_DEVICE", os.environ.get("FEDAC_TEST_DEVICE", "cpu"))
    return home


@pytest.fixture(autouse=True)
def process_state():
    """Every test starts with the signal dispositions of a foreground pytest whatever this process
    inherited, and leaves the process as it found it (helpers.terminal_process_state)."""
    with terminal_process_state():
        yield


@pytest.fixture(scope="session")
def gsc_root(tmp_path_factory):
    return make_gsc_tree(tmp_path_factory.mktemp("gsc"), speakers=8, clips=2)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module, and the count before it restored after the module (runs set
    it to cfg.runtime.threads). Tiny models gain nothing from intra-op threads, and on a busy 2-core
    machine they are ~10x slower. Use: pytestmark = pytest.mark.usefixtures("one_thread")."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def single_torch_thread():
    """Tiny models train faster on one thread, and tests stay fast when the machine is busy."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
