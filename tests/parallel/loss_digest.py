"""Losses, grid and parameters of a short tiny-model run, as digests to compare between two commits (a move that
must keep training bit-identical). Run the same command on both checkouts and compare the printed lines.

    horovodrun -np 2 -H localhost:2 --gloo python tests/parallel/loss_digest.py SCENE_CACHE OUT_DIR [flags]
    python tests/parallel/loss_digest.py SCENE_CACHE OUT_DIR --device cuda --config configs/nerf/base.json [flags]

40 steps (seed 7, warm-up 8, a grid update every 4 steps), then one test view; later flags override (e.g.
``--model_parallel 2``; on a GPU ``--backend triton`` takes the fast renderer). Rank 0 prints one line per rank: four losses in hex, their
sum, the grid's and the parameters' SHA-256 prefixes and the view's PSNR.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import tensor_digest, tiny_cpu_args  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.config import parse_args  # noqa: E402
from hvd_ngp.training.trainer import Trainer  # noqa: E402

STEPS = 40


def main() -> None:
    cache, out, *extra = sys.argv[1:]
    tr = Trainer.build(
        parse_args(
            tiny_cpu_args(
                Path(cache),
                Path(out),
                "--n_steps",
                str(STEPS),
                "--seed",
                "7",
                "--marching",
                '{"warmup_steps": 8, "update_interval": 4}',
                *extra,
            )
        )
    )
    losses = [float(tr.step(i)[0].loss) for i in range(STEPS)]
    psnr = tr.evaluate(n_views=1).get("psnr")
    rows = dist.allgather_object(
        (
            losses,
            tensor_digest([tr.grid.density, tr.grid.occupied]),
            tensor_digest([p.detach() for p in tr.field.parameters()]),
            psnr,
        ),
        name="loss_digest",
    )
    if dist.runtime().is_root:
        for rank, (ls, grid, params, p) in enumerate(rows):
            print(
                f"rank{rank} losses={[ls[i].hex() for i in (0, 9, 19, STEPS - 1)]} sum={sum(ls)!r} "
                f"grid={grid[:16]} params={params[:16]} psnr={p!r}",
                flush=True,
            )


if __name__ == "__main__":
    main()
