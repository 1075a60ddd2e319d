"""Synthetic stand-ins for public audio datasets (generated offline, no downloads)."""
