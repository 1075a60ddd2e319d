"""fedac: federated audio classification (FedMLAC and friends), simulator and Flower deployment.

Layers import downwards only (docs/architecture.md; the one list is LAYERS in
tests/test_import_layers.py): the core modules at this top level (errors, seeding, config, metrics,
version, report, ...), then data/, models/ + kernels/, training/, the rules at this top level
(aggregation, attacks, privacy), algorithms/, engine/, flower/, experiments/ (the papers' tables and
the commands that run them) and last cli.py. A new algorithm, model, dataset or training step goes
in its package, never at this top level. This file must not import anything: every fedac module
imports it first, and torch must stay out of `fedac --help`.
"""

__version__ = "0.1.0"
