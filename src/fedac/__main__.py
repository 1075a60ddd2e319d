"""`python -m fedac ...`: the `fedac` command, so that torchrun can start it (`torchrun
--nproc-per-node N -m fedac run ...`; engine/distributed.py)."""

import sys

from fedac.cli import main

if __name__ == "__main__":
    sys.exit(main())
