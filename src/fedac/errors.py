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
    """A speech encoder checkpoint (model.encoder_path) is missing, malformed or of an unknown
    kind."""


class RunInterrupted(FedacError):
    """SIGINT or SIGTERM ended a run at a round boundary (engine/rounds.py). `round` is the round of
    the checkpoint on disk, where a resume starts (None: no checkpoint yet); `during` names the work
    the signal cut short (an abandoned round, the final evaluation), None when the run stopped
    cleanly after `round` with a checkpoint written for it."""

    def __init__(
        self,
        run_dir,
        round: int | None,
        rounds: int,
        signum: int,
        during: str | None = None,
        continue_with: str | None = None,
    ):
        super().__init__(run_dir, round, rounds, signum, during)
        self.run_dir, self.round, self.rounds, self.signum, self.during = (
            run_dir,
            round,
            rounds,
            signum,
            during,
        )
        self.continue_with = continue_with
        """How to finish the run; None: `fedac run --resume <run_dir>` (fedac compare sets its
        own)."""

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM

    def __str__(self) -> str:
        where = "" if self.continue_with is None else f" ({self.run_dir})"
        again = self.continue_with or f"fedac run --resume {self.run_dir}"
        if self.during is None:
            return (
                f"interrupted after round {self.round} of {self.rounds}{where}; checkpoint "
                f"written; continue with: {again}"
            )
        if self.round is None:
            return (
                f"interrupted during {self.during}{where}, before the first checkpoint: nothing to "
                "resume; run the command again"
            )
        return (
            f"interrupted during {self.during}{where}; resume starts after round {self.round} of "
            f"{self.rounds} (the last checkpoint); continue with: {again}"
        )
