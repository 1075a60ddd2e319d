"""Datasets in their official on-disk layouts, features, partitions and corruption."""
