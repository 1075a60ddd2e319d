"""Datasets in their official on-disk layouts, features, partitions and corruption.

Belongs here: one loader per dataset's official layout and its `registry.py` entry (synth/ writes
the stand-ins), the Manifest every loader returns, audio I/O, features, partitions, corruption,
augmentation and per-round user streams. Must not be here: models, training or anything federated,
and no import of fedac.models, training, algorithms, engine or flower (data is the lowest layer
above core); never a download at run time.
"""
