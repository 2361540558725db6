"""Run under ``horovodrun -np N`` with ``HVD_NGP_FAULTS=nan_loss@R:S``: the NaN step is skipped on every rank.

    python tests/parallel/check_nonfinite.py SCENE_CACHE OUT_DIR EXPECTED_SKIPPED_STEP [trainer flags]

Asserts on every rank: the run finished, every rank skipped exactly that step (the verdict is
agreed, not local), and parameters and occupancy grids are bit-identical and finite everywhere.
Prints ``CHECK nonfinite_skipped OK`` on rank 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from check_training import digest  # noqa: E402
from conftest import TINY_ARGS  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.config import CPU_CONFIG, parse_args  # noqa: E402
from hvd_ngp.training.trainer import run  # noqa: E402


def main() -> None:
    cache, out_dir, expected, *extra = sys.argv[1:]
    args = parse_args(
        [
            "--config",
            str(CPU_CONFIG),
            *TINY_ARGS,
            "--scene_cache",
            cache,
            "--out_dir",
            out_dir,
            "--n_steps",
            "16",
            "--log_every",
            "8",
            "--device",
            "cpu",
            *extra,
        ]
    )
    result = run(args)
    rt = dist.runtime()
    mine = (result.metrics["nonfinite_skipped_steps"], digest(result.field.parameters()), digest([result.grid.density]))
    every = dist.allgather_object(mine, name="check.nonfinite")
    assert all(e == every[0] for e in every), f"ranks disagree: {every}"
    assert every[0][0] == [int(expected)], f"skipped steps {every[0][0]}, expected [{expected}]"
    assert all(bool(torch.isfinite(p).all()) for p in result.field.parameters()), "non-finite parameters"
    if rt.is_root:
        print(f"CHECK nonfinite_skipped OK (step {expected} skipped on all {rt.size} ranks)", flush=True)


if __name__ == "__main__":
    main()
