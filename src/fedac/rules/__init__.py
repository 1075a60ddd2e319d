"""The rules every algorithm and runtime can use over a round's uploads: how they are combined, how
poisoned clients attack them, and how they are kept private.

- aggregation.py: the n_k-weighted mean and LPA (deviation scores, pruning-bias measurements) and
  `aggregate`, the configured rule, returning an `Aggregate` (params, metrics, LPA's pruning);
- robust.py: the Byzantine-robust rules (median, trimmed mean, Krum, Multi-Krum, Bulyan, norm
  bounding);
- exits.py: `exit_aggregate`, uploads with different key sets (early-exit fine-tuning);
- attacks.py: poisoned clients (the `ATTACKS` registry); privacy.py: DP-FedAvg and its accountant.
- compression.py: what each client sends on the wire (top-k, rand-k, QSGD, int8, bf16 updates
  with error feedback), its byte count, and the upload the server rebuilds from it.

`AGGREGATORS`, the aggregator registry (fedac/registry.py; plug-ins: the `fedac.aggregators`
entry-point group), is re-exported here from fedac/settings/aggregation.py, where each rule's
settings are declared beside its "module:function" entry, so naming the rules (`fedac list`,
settings checks) imports no torch.

Belongs here: a rule any algorithm may apply to uploads or client data, with its settings read from
`Config` sections. Must not be here: one method's own server step (algorithms/), round running
(engine/), a lookup of an algorithm by name (the runtimes pass capabilities in, e.g.
`dp_compatible`), and no import of fedac.algorithms, engine, flower, experiments or cli.
"""

from __future__ import annotations

# the table and the rules' settings: torch-free, read by config
from fedac.settings.aggregation import AGGREGATORS

__all__ = ["AGGREGATORS"]
