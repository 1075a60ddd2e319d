# fedac_example/attack.py
"""An attack: what each malicious client (attack.fraction of them) sends. A free rider trains
nothing and uploads the global model it received, i.e. an update of zero."""

import torch

from fedac.rules.attacks import ClientAttack


class FreeRider(ClientAttack):
    poisons = "upload"

    def update(self, honest, index, malicious, round_idx, client):
        return {name: torch.zeros_like(delta) for name, delta in honest[index].items()}
