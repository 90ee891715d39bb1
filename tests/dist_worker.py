"""One rank of the torchrun test in test_trainer.py: train each recipe given on the command line in turn
(one process group for all of them, so the 2-process job pays the torch start-up once)."""

from __future__ import annotations

import sys

import torch

from depthlens.training.config import RunConfig, read_recipe
from depthlens.training.distributed import shutdown
from depthlens.training.trainer import train

if __name__ == "__main__":
    torch.set_num_threads(1)
    try:
        for path in sys.argv[1:]:
            train(RunConfig.from_dict(read_recipe(path)))
    finally:
        shutdown()
