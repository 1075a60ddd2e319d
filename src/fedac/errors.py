"""Typed errors. Every message names the file, client or setting at fault and how to fix it."""


class FedacError(Exception):
    """Base class for all errors fedac raises on purpose."""


class ConfigError(FedacError):
    """An unknown or ill-typed setting (config file, --set override, algorithm/dataset name)."""


class DatasetError(FedacError):
    """A dataset root, list file or metadata file is missing or malformed."""


class AudioError(FedacError):
    """An audio file cannot be decoded, or holds no samples."""


class ClientUpdateError(FedacError):
    """A client returned an unusable update (e.g. NaN or Inf parameters)."""


class CheckpointError(FedacError):
    """A run directory cannot be resumed (missing or incompatible checkpoint)."""


class EncoderError(FedacError):
    """A speech encoder checkpoint (model.encoder_path) is missing, malformed or of an unknown kind."""
