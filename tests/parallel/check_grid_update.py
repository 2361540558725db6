"""Run under ``horovodrun -np N``: the grid's update through ``GraphedGridUpdate``'s fixed buffers (its body
without a graph, as on the CPU) trains as the eager update on every rank.

    python tests/parallel/check_grid_update.py SCENE_CACHE OUT_DIR

Two runs of 36 steps (warm-up 8, an update every 4 steps), eager and through the fixed buffers: on each rank
the same losses and grid in both runs, bit for bit, and the same grid on every rank. Prints ``CHECK grid_update OK``
on rank 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from check_training import digest  # noqa: E402
from conftest import tiny_cpu_args  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.config import parse_args  # noqa: E402
from hvd_ngp.training.trainer import Trainer  # noqa: E402


def main() -> None:
    cache, out_dir = sys.argv[1:]
    runs = []
    for fixed in (False, True):
        tr = Trainer.build(
            parse_args(
                tiny_cpu_args(
                    Path(cache),
                    Path(out_dir) / str(fixed),
                    "--n_steps",
                    "36",
                    "--marching",
                    '{"warmup_steps": 8, "update_interval": 4}',
                )
            )
        )
        if fixed:
            tr.use_grid_graph("on", capture=False)
            assert tr.grid_graph is not None
        losses = [float(tr.step(i)[0].loss) for i in range(36)]
        runs.append((losses, digest([tr.grid.density, tr.grid.occupied])))
    every = dist.allgather_object(runs, name="check.grid_update")
    assert all(eager == fixed for eager, fixed in every), (
        "the fixed-buffer update trains differently from the eager one"
    )
    assert len({eager[1] for eager, _ in every}) == 1, "ranks hold different grids"
    rt = dist.runtime()
    if rt.is_root:
        print(f"CHECK grid_update OK ({rt.size} ranks)", flush=True)


if __name__ == "__main__":
    main()
