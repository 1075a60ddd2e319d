"""The training layer: what one client's training step needs, below the algorithms and the engine.

Belongs here: the types that algorithms, engine, attacks and the Flower apps share
(training/types.py: Params, Task, ClientData, ClientResult, EvalSplit, FederatedData, model_input);
local SGD loops (local.py); the seeded client step every runtime calls (step.py: train_client);
evaluation (evaluate.py) and its metrics (metrics.py: accuracy / F1 / UAR, WER / CER, EER, mean ±
std); the stacking machinery and its chunk planner (cohort.py, schedule.py).

Must not be here: anything that imports fedac.rules, algorithms, engine, flower or
the experiment modules (tests/test_import_layers.py fails on it); an algorithm's own loss or update
(algorithms/); building data from a config or running rounds (engine/).
"""
