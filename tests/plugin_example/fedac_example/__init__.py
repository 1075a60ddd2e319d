# fedac_example/__init__.py
"""An example fedac plug-in: one algorithm, model, dataset, aggregator and attack
(docs/extending.md)."""
