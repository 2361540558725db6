"""Run under ``horovodrun -np N``: the trainer's stall-check options reach Horovod.

    python tests/parallel/check_stall.py --stall_check_s 1

The options go through the trainer's parser and ``hvdtools.apply`` exactly as in a training run;
then the last rank sleeps 6 s before an allreduce the others are already waiting in, long
enough for Horovod's stall inspector (checking every N s) to report it on rank 0's stderr.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hvd_ngp.cluster import dist, hvdtools  # noqa: E402
from hvd_ngp.config import CPU_CONFIG, parse_args  # noqa: E402


def main() -> None:
    args = parse_args(["--config", str(CPU_CONFIG), *sys.argv[1:]])
    hvdtools.apply(args)
    rt = dist.init("cpu")
    if rt.rank == rt.size - 1:
        time.sleep(6 * args.stall_check_s)
    total = dist.allreduce(torch.ones(1), "sum", name="check.stall")
    assert float(total[0]) == rt.size


if __name__ == "__main__":
    main()
