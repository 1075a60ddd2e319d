"""Round loop, client sampling, evaluation, checkpoint/resume."""
