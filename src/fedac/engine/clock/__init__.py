"""Time on devices: who is chosen to train (selection.py), and when updates arrive."""
