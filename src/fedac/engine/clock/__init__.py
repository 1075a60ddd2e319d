"""Time on devices: who trains (selection.py), when updates arrive. No training code here."""
