"""Run under ``horovodrun -np N``: ``--grad_sync delayed``, ``delayed_grid`` and ``periodic``, asserted on every rank.

    python tests/parallel/check_gradsync.py SCENE_CACHE OUT_DIR [CHECK,CHECK,...]

CHECKs (default all): delayed, periodic, resume, fp16, fp16_resume, comp.

1. delayed: three steps (and the flush at the end) on fixed rays, SGD, equal a hand-computed reference:
   nothing moves at step 1, step t+1 applies the rank average of step t's gradients (gathered and
   averaged here by hand); every rank holds the same parameters after every step; delayed_grid the same, except
   that the MLPs take their own step's average (they move at step 1);
2. periodic (H = 2, Adam): the ranks differ after steps 1 and 3 and are identical (parameters and Adam
   moments) after step 2; a sync replaces every rank's tensors by their rank average;
3. the trainer, each mode: 8 steps straight == 4 steps, checkpoint, resume, 4 more (bit-identical
   parameters and parameter averages), and the ranks identical at the end.
4. fp16 (``delayed_grid`` on the fp16 wire, synthetic gradients of a wide range, an all-zero step and a step
   with an inf on the last rank): the applied late average equals, bit for bit, the hand computation of the
   encoding (the scale from the ranks' mean max |g|, fp16(g * s / N) per rank, summed in fp16, / s) on 2 ranks,
   and is within fp16 precision of the fp32 wire's average of the same gradients; a non-finite average is
   not applied; fp16_resume: 3 for the trainer with ``--compression fp16``.
5. comp (``--delay_compensation local``): the trainer, fp32 and fp16 wires: after every step theta, Adam's state
   and the parameter average are identical on every rank while each rank's w differs, w equals theta plus
   ``Adam.preview`` of the rank's own grid gradient, and an evaluation reads theta; then 3 (exact resume).
Prints ``CHECK <name> OK`` lines on rank 0; any failure raises (non-zero exit).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from check_comm import Setup as CommSetup  # noqa: E402
from conftest import TINY_ARGS, tensor_digest as digest  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.config import CPU_CONFIG, parse_args  # noqa: E402
from hvd_ngp.data.sampler import RaySampler  # noqa: E402
from hvd_ngp.model.field import NGPField  # noqa: E402
from hvd_ngp.training.gradsync import FP16_HEADROOM_LOG2, DelayedAveraging, PeriodicAveraging  # noqa: E402
from hvd_ngp.training.recipe import make_grid, make_optimizer  # noqa: E402
from hvd_ngp.training.step import StepContext, StepInputs, train_step  # noqa: E402
from hvd_ngp.training.trainer import Trainer, run  # noqa: E402

RAYS = 64
STEPS = 3
LR = 0.05


def same_on_every_rank(tensors, name: str) -> bool:
    every = dist.allgather_object(digest(tensors), name=name)
    return all(d == every[0] for d in every)


class Setup(CommSetup):
    """check_comm's model, scene and marching; its own rays."""

    def __init__(self, cache: str) -> None:
        super().__init__(cache)
        rt = dist.runtime()
        n_pix = len(self.scene.train) * self.scene.train.height * self.scene.train.width
        gen = torch.Generator().manual_seed(7)
        sampler = RaySampler(self.scene.train, 0, 1, 0, torch.device("cpu"), jitter=False)
        # every rank draws every rank's rays (the reference needs them all); rank r trains on rays[s][r]
        self.rays = [
            [sampler.rays_for_pixels(torch.randperm(n_pix, generator=gen)[:RAYS]) for _ in range(rt.size)]
            for _ in range(STEPS + 1)
        ]

    def field(self) -> NGPField:
        torch.manual_seed(0)
        return NGPField(self.args.model, self.scene.aabb, "torch")

    def step(self, field, opt, rays, step: int, exchange=None):
        """Step number ``step`` (1-based, as the exchange counts them)."""
        grid = make_grid(self.args.model["marching"], self.scene)  # all cells occupied: no update needed
        ctx = StepContext(field, grid, opt, self.march, self.loss_fn, exchange=exchange)
        return train_step(ctx, StepInputs(rays, torch.ones(len(rays), 3), None, step=step - 1))

    def local_gradient(self, params: list[torch.Tensor], rays) -> list[torch.Tensor]:
        """The gradient one rank's ``rays`` give at ``params`` (no update: learning rate 0)."""
        field = self.field()
        with torch.no_grad():
            for p, q in zip(field.parameters(), params):
                p.copy_(q)
        self.step(field, torch.optim.SGD(field.parameters(), lr=0.0), rays, 1)
        return [p.grad.clone() for p in field.parameters()]


def check_delayed(s: Setup, grid_only: bool = False) -> None:
    """``grid_only`` (``--grad_sync delayed_grid``): the MLPs' average applied in its own step, the grid's one late."""
    rt = dist.runtime()
    field = s.field()
    opt = torch.optim.SGD(field.parameters(), lr=LR)
    fresh_ids = {id(p) for p in field.mlp_parameters()} if grid_only else set()
    fresh = [id(p) in fresh_ids for p in field.parameters()]
    assert not grid_only or 0 < sum(fresh) < len(fresh), "the field must have both MLP and grid parameters"
    exchange = DelayedAveraging(field.named_parameters(), None, fresh=field.mlp_parameters() if grid_only else ())
    ref = [p.detach().clone() for p in field.parameters()]
    moved = []
    previous = None  # the hand-averaged gradient of the previous step
    for t in range(STEPS + 1):
        if t < STEPS:
            s.step(field, opt, s.rays[t][rt.rank], t + 1, exchange)
        else:
            assert exchange.flush(opt, None), "the flush applied nothing"
        # the reference: step t applies the average of step t-1's gradients (taken at the parameters then); with
        # grid_only the MLPs take step t's own average
        grads = [s.local_gradient(ref, s.rays[t][r]) for r in range(rt.size)] if t < STEPS else None
        current = None if grads is None else [sum(g[i] for g in grads) / rt.size for i in range(len(ref))]
        ref = [
            p - LR * g if g is not None else p
            for p, g in zip(
                ref,
                [
                    (current[i] if current is not None else None)
                    if fresh[i]
                    else (previous[i] if previous is not None else None)
                    for i in range(len(ref))
                ],
            )
        ]
        previous = current
        for i, (p, q) in enumerate(zip(field.parameters(), ref)):
            torch.testing.assert_close(
                p.detach(), q, rtol=1e-5, atol=1e-7, msg=lambda m: f"delayed, step {t + 1}, parameter {i}: {m}"
            )
        assert same_on_every_rank(list(field.parameters()), f"check.delayed.{t}"), f"ranks differ after step {t + 1}"
        moved.append(
            [
                max(
                    float((p.detach() - q0).abs().max()) if fresh[i] == side else 0.0
                    for i, (p, q0) in enumerate(zip(field.parameters(), s.field().parameters()))
                )
                for side in (True, False)
            ]
        )
    late = [m[1] for m in moved]
    assert late[0] == 0.0 and all(m > 0 for m in late[1:]), f"largest late-parameter change per step: {late}"
    if grid_only:
        assert moved[0][0] > 0, "delayed_grid: the MLPs must move at step 1 (their average is not late)"
    name = "delayed_grid_reference" if grid_only else "delayed_reference"
    if rt.is_root:
        print(
            f"CHECK {name} OK ({STEPS} steps + flush on {rt.size} ranks: step t+1 applies step t's "
            f"average{' to the grid, the MLPs their own step' if grid_only else ''}; largest change from the "
            f"start per step {['%.2e' % max(m) for m in moved]})",
            flush=True,
        )


def check_periodic(s: Setup) -> None:
    rt = dist.runtime()
    field = s.field()
    opt, _ = make_optimizer(field, s.args.model["optimizer"], "test")
    exchange = PeriodicAveraging(field, opt, 2)
    same = []
    for t in range(STEPS):
        s.step(field, opt, s.rays[t][rt.rank], t + 1, exchange)
        same.append(same_on_every_rank(exchange.tensors(), f"check.periodic.{t}"))
    assert same == [False, True, False], f"identical on every rank after steps 1-3: {same}"
    before = [t.clone() for t in exchange.tensors()]
    gathered = [dist.allgather(t[None], name=f"check.periodic.before.{i}") for i, t in enumerate(before)]
    exchange.sync()
    for i, (t, g) in enumerate(zip(exchange.tensors(), gathered)):
        torch.testing.assert_close(t, g.mean(dim=0), rtol=1e-5, atol=1e-8, msg=lambda m: f"sync, tensor {i}: {m}")
    assert same_on_every_rank(exchange.tensors(), "check.periodic.synced")
    if rt.is_root:
        print(
            f"CHECK periodic_sync OK (H = 2: ranks {same} identical after steps 1-3; a sync averages "
            f"{len(before)} tensors: parameters and Adam moments)",
            flush=True,
        )


FP16_STEPS = 4  # 1: a wide range, 2: all zero, 3: an inf on the last rank, 4: a wide range again
GRID, MLP = 4096, 8


def synthetic_gradient(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s (grid ``[GRID]``, MLP ``[MLP]``) gradient at fp16-check step ``step`` (every rank can
    compute every rank's): magnitudes from 1e-12 to 1e-1, some exact zeros."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    grid = torch.randn(GRID, generator=gen) * 10.0 ** torch.empty(GRID).uniform_(-12, -1, generator=gen)
    grid[torch.rand(GRID, generator=gen) < 0.1] = 0.0
    if step == 2:
        grid.zero_()
    if step == 3 and rank == dist.runtime().size - 1:
        grid[5] = float("inf")
    return grid, torch.randn(MLP, generator=gen)


def fp16_by_hand(step: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """-> (the fp16 wire's decoded sum on 2 ranks, the ranks' mean |g| per element, the scale s) for ``step``."""
    n = dist.runtime().size
    grads = [synthetic_gradient(step, r)[0] for r in range(n)]
    bound = float(torch.stack([g.abs().max() for g in grads]).sum() / n)  # what the fresh allreduce averages
    scale = 2.0 ** (FP16_HEADROOM_LOG2 - math.frexp(bound)[1]) if bound > 0 and math.isfinite(bound) else 1.0
    factor = torch.tensor(scale / n, dtype=torch.float32)
    wire = [(g * factor).half() for g in grads]
    total = wire[0]
    for w in wire[1:]:
        total = total + w  # fp16 + fp16, rounded to fp16: what the allreduce's sum does
    return total.float() / scale, sum(g.abs() for g in grads) / n, scale


def check_fp16_wire() -> None:
    """``delayed_grid`` on the fp16 wire against the hand computation and the fp32 wire (module docstring, 4)."""
    rt = dist.runtime()
    runs = {}
    for wire in ("fp16", "fp32"):
        grid, mlp = torch.nn.Parameter(torch.zeros(GRID)), torch.nn.Parameter(torch.zeros(MLP))
        exchange = DelayedAveraging([("grid", grid), ("mlp", mlp)], None, fresh=[mlp], wire=wire)
        runs[wire] = (grid, mlp, torch.optim.SGD([grid, mlp], lr=1.0), exchange)
    loss = torch.tensor(0.0)
    for t in range(1, FP16_STEPS + 2):
        landed = {}
        for wire, (grid, mlp, opt, exchange) in runs.items():
            before = grid.detach().clone()
            if t <= FP16_STEPS:
                exchange.zero_grad()
                g, m = synthetic_gradient(t, rt.rank)
                grid.grad.copy_(g)
                mlp.grad.copy_(m)
                exchange.finish(opt, None, loss, t)
            else:
                exchange.flush(opt, None)
            landed[wire] = grid.grad.detach().clone()
            if t - 1 == 3:  # step 3's average holds an inf: not applied, no error
                assert not torch.isfinite(landed[wire]).all() and torch.equal(grid.detach(), before), wire
        if t == 1 or t - 1 == 3:
            continue
        hand, spread, scale = fp16_by_hand(t - 1)
        if rt.size == 2:  # fp16 + fp16 is one rounding; with more ranks the sum's order is the allreduce's
            assert torch.equal(landed["fp16"], hand), (
                f"step {t - 1}: fp16 wire differs from the hand computation at "
                f"{int((landed['fp16'] != hand).sum())} of {GRID} elements"
            )
        # each fp16 rounding is within 2^-11 relative, or half fp16's smallest step (2^-25) absolute, of g * s / N
        err = (landed["fp16"] - landed["fp32"]).abs()
        tol = 2.0**-10 * 1.01 * spread + (rt.size + 1) * 2.0**-25 / scale
        assert (err <= tol).all(), f"step {t - 1}: fp16 wire off the fp32 average by up to {float((err - tol).max())}"
        if t - 1 == 2:
            assert not landed["fp16"].any(), "an all-zero gradient must land as zeros"
    assert same_on_every_rank([r[0] for r in runs.values()], "check.fp16"), "ranks differ on the fp16 wire"
    grid16, grid32 = runs["fp16"][0].detach(), runs["fp32"][0].detach()
    rel = float((grid16 - grid32).abs().max() / grid32.abs().max())
    if rt.is_root:
        print(
            f"CHECK fp16_wire OK ({FP16_STEPS} steps + flush on {rt.size} ranks: the late average equals the hand "
            f"encoding{' bit for bit' if rt.size == 2 else ''}, within fp16 precision of the fp32 wire (grid after "
            f"the flush: largest difference {rel:.1e} of its largest entry); zeros land as zeros, an inf is not "
            "applied)",
            flush=True,
        )


def trainer_argv(cache: str, *more: str) -> list[str]:
    """The tiny model on the CPU, one test view evaluated, no renders saved; then ``more``."""
    return [
        "--config",
        str(CPU_CONFIG),
        *TINY_ARGS,
        "--scene_cache",
        cache,
        "--device",
        "cpu",
        "--n_eval_views",
        "1",
        "--save_renders",
        "0",
        *more,
    ]


def check_resume(cache: str, out: Path, mode: str, *more: str, label: str | None = None) -> None:
    rt = dist.runtime()
    argv = trainer_argv(cache, "--log_every", "4", "--grad_sync", mode, *more)
    label = label or mode
    straight = run(parse_args([*argv, "--out_dir", str(out / label / "a"), "--n_steps", "8", "--ckpt_every", "4"]))
    a = digest([*straight.field.parameters(), *straight.grid.density[None]])
    ckpt = out / label / "a" / "checkpoints" / "ckpt-00000004.pt"
    resumed = run(parse_args([*argv, "--out_dir", str(out / label / "b"), "--n_steps", "8", "--resume", str(ckpt)]))
    b = digest([*resumed.field.parameters(), *resumed.grid.density[None]])
    every = dist.allgather_object((a, b), name=f"check.resume.{label}")
    assert all(x == y for x, y in every), f"{label}: resumed parameters differ from the uninterrupted run: {every}"
    assert len({x for x, _ in every}) == 1, f"{label}: ranks differ at the end: {every}"
    if rt.is_root:
        print(
            f"CHECK exact_resume_{label} OK (8 steps == 4 + resume + 4, identical on {rt.size} ranks; "
            f"test PSNR {straight.metrics['test_psnr']:.2f} dB)",
            flush=True,
        )


def check_compensation(cache: str, out: Path, *more: str, label: str = "comp") -> None:
    """``--delay_compensation local`` on the trainer (module docstring, 5)."""
    rt = dist.runtime()
    argv = trainer_argv(
        cache, "--out_dir", str(out / label), "--grad_sync", "delayed_grid", "--delay_compensation", "local", *more
    )
    tr = Trainer.build(parse_args([*argv, "--n_steps", "4"]))
    spec = tr.exchange.speculative
    assert spec is not None, "--delay_compensation local must build the speculative grid"
    for step in range(4):
        stashed = {}
        original = spec.stash

        def stash_and_keep() -> None:  # this rank's own late gradient, as the exchange keeps it
            original()
            stashed["g"] = [a.clone() for a in spec.anchor]

        spec.stash = stash_and_keep
        tr.step(step)
        tr.state.step = step + 1
        spec.stash = original
        assert spec.ahead, f"step {step + 1}: the parameters must hold w"
        # w is theta plus Adam's step for this rank's gradient, from the committed state
        with torch.no_grad():
            for p, a, g in zip(spec.params, spec.anchor, stashed["g"]):
                live = p.detach().clone()
                p.copy_(a)
                expected = tr.optimizer.preview(p, g)
                p.copy_(live)
                torch.testing.assert_close(live, expected, rtol=0, atol=0, msg=lambda m: f"step {step + 1}: w {m}")
        moments = [t for st in tr.optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        shared = [*spec.anchor, *moments, *tr.state.ema.average] if tr.state.ema is not None else [*spec.anchor]
        assert same_on_every_rank(shared, f"check.{label}.theta.{step}"), (
            f"step {step + 1}: theta, Adam's state or the parameter average differ between ranks"
        )
        mine = same_on_every_rank(spec.params, f"check.{label}.w.{step}")
        assert not mine or rt.size == 1, f"step {step + 1}: every rank's w is the same (no speculation?)"
    with tr.exchange.consensus():
        inside = digest(spec.params)
        assert inside == digest(spec.anchor), "an evaluation must read theta"
    assert digest(spec.params) != inside, "after an evaluation the parameters must hold w again"
    if rt.is_root:
        print(
            f"CHECK {label}_ranks OK (4 steps on {rt.size} ranks: theta, Adam's state and the average identical, "
            "w per rank = theta + Adam.preview(own gradient); evaluations read theta)",
            flush=True,
        )


def main() -> None:
    cache, out = sys.argv[1], Path(sys.argv[2])
    everything = ["delayed", "periodic", "resume", "fp16", "fp16_resume", "comp"]
    checks = sys.argv[3].split(",") if len(sys.argv) > 3 else everything
    dist.init("cpu")
    s = Setup(cache)
    if "delayed" in checks:
        check_delayed(s)
        check_delayed(s, grid_only=True)
    if "periodic" in checks:
        check_periodic(s)
    if "resume" in checks:
        check_resume(cache, out, "delayed")
        check_resume(cache, out, "delayed_grid")
        check_resume(cache, out, "periodic", "--sync_period", "3")
    if "fp16" in checks:
        check_fp16_wire()
    if "fp16_resume" in checks:
        check_resume(cache, out, "delayed_grid", "--compression", "fp16", label="delayed_grid_fp16")
    if "comp" in checks:
        check_compensation(cache, out)
        check_compensation(cache, out, "--compression", "fp16", label="comp_fp16")
        check_resume(cache, out, "delayed_grid", "--delay_compensation", "local", label="delayed_grid_comp")


if __name__ == "__main__":
    main()
