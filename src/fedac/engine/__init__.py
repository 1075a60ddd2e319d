"""Round loop, client sampling, evaluation, checkpoint/resume.

Belongs here: the round drivers (simulator.py over a fixed partition, zeroshot.py for fresh user
data every round, both on run.py's one run skeleton and rounds.py's RoundLoop; runner.py picks one
from the algorithm's `streaming` capability), building FederatedData and resident tensors from a
config, a round's cohort dispatch, evaluation each round, checkpoints, and the run directory's
writers (report.py: metrics.csv, results.json, lpa.jsonl, tables and curves; tracking.py:
TensorBoard / MLflow). Must not be here: algorithm logic or algorithm names (the engine reads an
algorithm's capabilities and never branches on its name), a paper's tables or experiment grids, and
no import of fedac.flower, the experiment commands or cli.
"""
