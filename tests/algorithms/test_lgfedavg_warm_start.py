"""LG-FedAvg's warm start (`lgfedavg.warm_start`): every client's initial network and the
server's initial head are a FedAvg run's global model, as the official code starts; a run directory
without one, or of another network, is refused by name."""

from __future__ import annotations

import pytest
import torch

from algorithm_harness import build, clients, federate, max_diff
from fedac.algorithms.fedavg import FedAvg
from fedac.algorithms.lgfedavg import LGFedAvg
from fedac.errors import ConfigError


def fedavg_run(tmp_path, model: str = "crnn_tiny"):
    """A FedAvg run directory's checkpoint (two rounds of the harness's clients)."""
    server, _, _ = federate(build(FedAvg, model, "sequential"), clients())
    torch.save({"server": {"params": server["params"]}, "round": 2}, tmp_path / "checkpoint.pt")
    return server["params"]


def test_every_client_and_the_head_start_from_the_fedavg_model(tmp_path):
    fedavg = fedavg_run(tmp_path)
    warm = build(LGFedAvg, "crnn_tiny", "sequential", f"lgfedavg.warm_start={tmp_path}")
    cold = build(LGFedAvg, "crnn_tiny", "sequential")
    assert max_diff(warm.init_client_state("c0"), fedavg) == 0
    head = warm.init_server()["params"]
    assert set(head) == set(warm.shared) and max_diff(head, fedavg) == 0
    assert max_diff(cold.init_client_state("c0"), fedavg) > 1e-3
    # by effect: the first LG round trains from the FedAvg model
    data = clients()
    assert (
        max_diff(federate(warm, data, 1)[0]["params"], federate(cold, data, 1)[0]["params"]) > 1e-3
    )


def test_a_folder_without_a_fedavg_run_or_of_another_network_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="lgfedavg.warm_start: .*no checkpoint.pt"):
        build(LGFedAvg, "crnn_tiny", "sequential", f"lgfedavg.warm_start={tmp_path}").init_server()
    fedavg_run(tmp_path, "cnn1_softmax")
    with pytest.raises(ConfigError, match="is not this run's network"):
        build(LGFedAvg, "crnn_tiny", "sequential", f"lgfedavg.warm_start={tmp_path}").init_server()
