"""The papers' experiments and the commands that run and check them: the wing above the library.

Belongs here: each paper's tables as declarative specs (`spec.Experiment`, one file per paper:
fedmlac.py, fedkws.py, robustness.py, earlyexit.py, zeroshot.py; catalog.py lists them all), the one
runner and writer that turn a spec into runs, table.md, results.csv and a figure (runner.py), and
the commands built on them: `fedac compare` (compare.py), `fedac reproduce` (reproduce.py), `fedac
report` (figures.py), `fedac memory` (exit_memory.py), `fedac pretrain` (pretrain.py; its torch-free
settings and parser: pretrain_settings.py) and FedKWS-UI's part of `fedac data stats`
(kws_stats.py). A new paper table is a new `Experiment` in its paper's file, not new code.

Must not be here: algorithm, model, dataset or round-loop logic (those live in the library below).
No module under data/, models/, training/, algorithms/, engine/ or flower/ imports this package, and
the modules that the `fedac` parser loads (reproduce, catalog, the paper files, compare) import no
torch at module level. This file imports nothing.
"""
