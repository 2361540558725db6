"""Run under ``horovodrun -np N``: fp16 gradient compression and gradient accumulation, asserted on every rank.

    python tests/parallel/check_comm.py SCENE_CACHE

1. fp16 compression (with its loss scaling) gives the same parameters on every rank, and gradients
   and parameters that match an uncompressed run within half-precision tolerance; a plain fp16 cast
   of the same gradients would not (the tolerance is tight enough to notice flushed gradients);
2. two backward passes per step (Horovod ``backward_passes_per_step=2``) give the gradients and
   parameters of one pass over the same rays, identical on every rank.
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
from hvd_ngp.training.recipe import Marching, make_grid, make_loss, make_optimizer, make_scaler  # noqa: E402
from hvd_ngp.training.step import StepContext, StepInputs, train_step  # noqa: E402

RAYS_PER_RANK = 96
STEPS = 3


class Setup:
    """Everything a step needs; ``run`` trains a fresh model (same init everywhere) on fixed rays."""

    def __init__(self, cache: str) -> None:
        self.args = parse_args(["--config", str(CPU_CONFIG), *TINY_ARGS, "--scene_cache", cache, "--device", "cpu"])
        self.scene = load_scene("builtin", scene_cache=cache)
        self.march = Marching.from_config(self.args.model["marching"], self.scene.aabb_scale)
        self.loss_fn = make_loss(self.args.model["loss"], "test")
        rt = dist.runtime()
        n_pix = len(self.scene.train) * self.scene.train.height * self.scene.train.width
        gen = torch.Generator().manual_seed(123)
        sampler = RaySampler(self.scene.train, 0, 1, 0, torch.device("cpu"), jitter=False)
        # step s: this rank's slice of a batch drawn for that step
        self.rays = [
            sampler.rays_for_pixels(
                torch.randperm(n_pix, generator=gen)[: RAYS_PER_RANK * rt.size][
                    rt.rank * RAYS_PER_RANK : (rt.rank + 1) * RAYS_PER_RANK
                ]
            )
            for _ in range(STEPS)
        ]

    def run(self, steps: int, compression: str = "none", backward_passes: int = 1, precision: str = "fp32"):
        """-> (model, gradients after the first step, scaler or None)."""
        torch.manual_seed(0)
        field = NGPField(self.args.model, self.scene.aabb, "torch")
        grid = make_grid(self.args.model["marching"], self.scene)  # all cells occupied: no update needed
        opt, _ = make_optimizer(field, self.args.model["optimizer"], "test")
        opt = dist.distributed_optimizer(opt, field.named_parameters(), compression, backward_passes)
        comm = parse_args(["--compression", compression]).comm
        scaler = make_scaler(precision, comm, torch.device("cpu"), dist.runtime().size)
        first_grads = None
        ctx = StepContext(
            field, grid, opt, self.march, self.loss_fn, precision, scaler, backward_passes=backward_passes
        )
        for step in range(steps):
            rays = self.rays[step]
            train_step(ctx, StepInputs(rays, torch.ones(3).expand(len(rays), 3), None))
            if first_grads is None:
                first_grads = [p.grad.clone() for p in field.parameters()]
        return field, first_grads, scaler


def assert_same_on_every_rank(field: torch.nn.Module, what: str) -> None:
    every = dist.allgather_object(digest(field.parameters()), name=f"check.{what}")
    assert len(set(every)) == 1, f"{what}: parameters differ across ranks: {every}"


def local_first_step(setup: Setup) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(initial parameters, this rank's own gradients of the first step before any allreduce)."""
    torch.manual_seed(0)
    field = NGPField(setup.args.model, setup.scene.aabb, "torch")
    init = [p.detach().clone() for p in field.parameters()]
    grid = make_grid(setup.args.model["marching"], setup.scene)
    opt, _ = make_optimizer(field, setup.args.model["optimizer"], "test")
    rays = setup.rays[0]
    ctx = StepContext(field, grid, opt, setup.march, setup.loss_fn)
    train_step(ctx, StepInputs(rays, torch.ones(3).expand(len(rays), 3), None))
    return init, [p.grad.clone() for p in field.parameters()]


def check_fp16_compression(setup: Setup) -> None:
    ref, ref_grads, _ = setup.run(STEPS)
    fp16, fp16_grads, scaler = setup.run(STEPS, compression="fp16")
    assert_same_on_every_rank(fp16, "fp16")
    if dist.runtime().size > 1:
        assert scaler is not None and scaler.get_scale() == 2.0**16, "a step overflowed and was skipped"
    names = [n for n, _ in ref.named_parameters()]
    # Each rank's gradient is rounded to half precision (2^-11 relative), summed and rounded again:
    # the error scales with the ranks' own magnitudes (their average may cancel), plus what the
    # 2^16 loss scale leaves subnormal (below 1e-12).
    init, local = local_first_step(setup)
    magnitude = [dist.allreduce(g.abs(), "avg", name=f"check.mag.{i}") for i, g in enumerate(local)]
    flushed_plain = 0
    for name, g16, g32, mag, p0, p16, p32 in zip(
        names, fp16_grads, ref_grads, magnitude, init, fp16.parameters(), ref.parameters()
    ):
        tol = 4 * 2.0**-11 * mag + 1e-12
        err = (g16 - g32).abs()
        assert bool((err <= tol).all()), (
            f"grad {name}: {int((err > tol).sum())} values off, worst {float((err - tol).max()):.3g}"
        )
        plain = g32.half().float()  # what compression without loss scaling would keep
        flushed_plain += int(((plain - g32).abs() > tol).sum())
        # the trajectories: within 1% of how far the uncompressed run moved (measured: at most 0.25%)
        moved = float((p32.detach() - p0).norm())
        apart = float((p16.detach() - p32.detach()).norm())
        assert apart <= 1e-2 * moved, f"param {name}: {apart:.3g} apart after moving {moved:.3g}"
    assert flushed_plain > 0, "the tolerance cannot tell scaled from unscaled fp16 compression"
    if dist.runtime().is_root:
        print(
            f"CHECK fp16_compression OK ({STEPS} steps; plain fp16 would have lost {flushed_plain} gradient values)",
            flush=True,
        )


def check_accumulation(setup: Setup) -> None:
    ref, ref_grads, _ = setup.run(STEPS)
    acc, acc_grads, _ = setup.run(STEPS, backward_passes=2)
    assert_same_on_every_rank(acc, "accumulation")
    for (name, p), q, ga, gr in zip(acc.named_parameters(), ref.parameters(), acc_grads, ref_grads):
        torch.testing.assert_close(ga, gr, rtol=1e-4, atol=1e-9, msg=lambda m: f"grad {name}: {m}")
        sure = gr.abs() > 1e-8
        torch.testing.assert_close(
            p.detach()[sure], q.detach()[sure], rtol=0, atol=1e-5, msg=lambda m: f"param {name}: {m}"
        )
    if dist.runtime().is_root:
        print(
            f"CHECK accumulation OK (2 passes x {RAYS_PER_RANK // 2} rays == 1 pass x {RAYS_PER_RANK} rays, "
            f"{STEPS} steps)",
            flush=True,
        )


def main() -> None:
    (cache,) = sys.argv[1:]
    dist.init("cpu")
    setup = Setup(cache)
    check_fp16_compression(setup)
    check_accumulation(setup)


if __name__ == "__main__":
    main()
