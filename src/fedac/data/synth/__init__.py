"""Synthetic stand-ins for public audio datasets (generated offline, no downloads).

Belongs here: one generator per dataset that writes the real dataset's official on-disk layout,
deterministically from a seed (so the real loader in data/ reads it), and the espeak-ng binding they
share. Must not be here: a loader or a layout of the stand-in's own (the loaders in data/ are the
only readers), anything above the data layer, and never a network download.
"""
