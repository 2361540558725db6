"""Run under ``horovodrun -np N``: cross-rank facts of training, asserted on every rank.

    python tests/parallel/check_training.py SCENE_CACHE OUT_DIR [extra trainer flags]

1. one step on N ranks x B/N rays == one step on 1 rank x B rays (gradients and parameters);
2. after a short real training run: parameters and occupancy grids bit-identical on all ranks;
3. ray shards disjoint across ranks and covering every training pixel.
Prints ``CHECK <name> OK`` lines on rank 0; any failure raises (non-zero exit).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import TINY_ARGS, tensor_digest as digest  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.config import CPU_CONFIG, parse_args  # noqa: E402
from hvd_ngp.data import load_scene  # noqa: E402
from hvd_ngp.data.sampler import RaySampler  # noqa: E402
from hvd_ngp.model.field import NGPField  # noqa: E402
from hvd_ngp.training.recipe import Marching, make_grid, make_loss, make_optimizer  # noqa: E402
from hvd_ngp.training.step import StepContext, StepInputs, train_step  # noqa: E402
from hvd_ngp.training.trainer import run  # noqa: E402


def check_step_equivalence(args, scene) -> None:
    rt = dist.runtime()
    B = 96 * rt.size
    gen = torch.Generator().manual_seed(123)
    n_pix = len(scene.train) * scene.train.height * scene.train.width
    pixels = torch.randperm(n_pix, generator=gen)[:B]
    march = Marching.from_config(args.model["marching"], scene.aabb_scale)
    loss_fn = make_loss(args.model["loss"], "test")
    white = torch.ones(3)

    def build():
        torch.manual_seed(0)
        field = NGPField(args.model, scene.aabb, args.backend if args.backend != "auto" else "torch")
        grid = make_grid(args.model["marching"], scene)  # all cells occupied: no update needed
        opt, _ = make_optimizer(field, args.model["optimizer"], "test")
        return field, grid, opt

    sampler = RaySampler(scene.train, 0, 1, 0, torch.device("cpu"), jitter=False)
    # distributed: this rank's contiguous B/N slice
    field, grid, opt = build()
    opt = dist.distributed_optimizer(opt, field.named_parameters())
    mine = sampler.rays_for_pixels(pixels[rt.rank * 96 : (rt.rank + 1) * 96])
    train_step(StepContext(field, grid, opt, march, loss_fn), StepInputs(mine, white.expand(len(mine), 3), None))
    # reference: the whole batch in one process
    ref, ref_grid, ref_opt = build()
    full = sampler.rays_for_pixels(pixels)
    train_step(StepContext(ref, ref_grid, ref_opt, march, loss_fn), StepInputs(full, white.expand(len(full), 3), None))
    for (name, p), q in zip(field.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7, msg=lambda m: f"grad {name}: {m}")
        # Adam's first step is lr * sign(g): compare where the sign is well defined
        sure = q.grad.abs() > 1e-6
        torch.testing.assert_close(
            p.detach()[sure], q.detach()[sure], rtol=1e-5, atol=1e-6, msg=lambda m: f"param {name}: {m}"
        )
    if rt.is_root:
        print(f"CHECK step_equivalence OK ({rt.size} x {B // rt.size} rays == 1 x {B} rays)", flush=True)


def check_training_consistency(args) -> None:
    rt = dist.runtime()
    result = run(args)
    mine = (digest(result.field.parameters()), digest([result.grid.density, result.grid.occupied]))
    every = dist.allgather_object(mine, name="check.digests")
    assert all(d[0] == every[0][0] for d in every), f"parameters differ across ranks: {every}"
    assert all(d[1] == every[0][1] for d in every), f"occupancy grids differ across ranks: {every}"
    occupied = result.grid.occupancy_fraction()
    # warm-up updates refresh every cell, each rank evaluating only its 1/N share: values everywhere
    # prove the Max reduction merged the shares
    assert bool((result.grid.density > 0).all()), "some cells were never refreshed on this rank"
    if rt.is_root:
        print(f"CHECK identical_parameters OK ({result.step} steps, {rt.size} ranks)", flush=True)
        print(f"CHECK identical_grids OK (occupied {100 * occupied:.1f}%)", flush=True)


def check_shards(args, scene) -> None:
    rt = dist.runtime()
    shard = RaySampler(scene.train, rt.rank, rt.size, args.seed, torch.device("cpu")).shard_pixels()
    shards = dist.allgather_object(shard, name="check.shards")
    allpix = torch.cat(shards)
    n_pix = len(scene.train) * scene.train.height * scene.train.width
    assert allpix.numel() == n_pix and torch.unique(allpix).numel() == n_pix, "shards overlap or miss pixels"
    if rt.is_root:
        print(f"CHECK disjoint_shards OK ({rt.size} shards cover {n_pix} pixels)", flush=True)


def main() -> None:
    cache, out_dir, *extra = sys.argv[1:]
    argv = [
        "--config",
        str(CPU_CONFIG),
        *TINY_ARGS,
        "--scene_cache",
        cache,
        "--out_dir",
        out_dir,
        "--n_steps",
        "40",
        "--log_every",
        "20",
        "--device",
        "cpu",
        *extra,
    ]
    args = parse_args(argv)
    dist.init("cpu")
    scene = load_scene("builtin", scene_cache=cache)
    check_step_equivalence(args, scene)
    check_shards(args, scene)
    check_training_consistency(args)


if __name__ == "__main__":
    main()
