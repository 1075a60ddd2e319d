# fedac_example/__init__.py
"""An example fedac plug-in: one algorithm, model, dataset, aggregator, attack and compression
codec (docs/extending.md)."""
