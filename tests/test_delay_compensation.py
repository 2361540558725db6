"""``--delay_compensation local`` (training/gradsync.py ``SpeculativeGrid``, training/optim.py ``Adam.preview``):
the option's rules, the speculative step against a hand-computed Adam step, and one rank training like ``every``.
Two real ranks (theta shared, w per rank, exact resume): tests/test_gradsync.py's ``comp`` checks."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_cpu_args

from hvd_ngp.config import parse_args
from hvd_ngp.errors import ConfigError
from hvd_ngp.training.gradsync import DelayedAveraging
from hvd_ngp.training.optim import Adam
from hvd_ngp.training.trainer import Trainer

B1, B2, EPS, LR = 0.9, 0.99, 1e-8, 0.1


def settings(*argv: str):
    return parse_args(["--device", "cpu", *argv]).comm


def test_only_with_delayed_grid():
    for mode in ("every", "delayed", "periodic"):
        with pytest.raises(
            ConfigError, match=f"^--delay_compensation local needs --grad_sync delayed_grid \\(it is {mode}\\)$"
        ):
            settings("--grad_sync", mode, "--delay_compensation", "local")
    comp = settings("--grad_sync", "delayed_grid", "--delay_compensation", "local", "--compression", "fp16")
    assert comp.delay_compensation == "local" and "speculative Adam step" in comp.describe_sync()
    assert settings("--grad_sync", "delayed_grid").delay_compensation == "none"
    with pytest.raises(ValueError, match="needs fresh parameters"):
        DelayedAveraging([torch.nn.Parameter(torch.zeros(3))], None, speculate_with=object())


def _exchange(sparse: bool):
    grid, mlp = torch.nn.Parameter(torch.zeros(6)), torch.nn.Parameter(torch.zeros(2))
    with torch.no_grad():
        grid.copy_(torch.linspace(-1.0, 1.0, 6))
    opt = Adam([{"params": [grid], "sparse": sparse}, {"params": [mlp]}], lr=LR, betas=(B1, B2), eps=EPS)
    return grid, mlp, opt, DelayedAveraging([("grid", grid), ("mlp", mlp)], None, fresh=[mlp], speculate_with=opt)


def _step(grid, mlp, opt, exchange, g: torch.Tensor, step: int) -> None:
    exchange.zero_grad()
    grid.grad.copy_(g)
    mlp.grad.fill_(1.0)
    exchange.finish(opt, None, torch.tensor(0.0), step)


def test_speculative_step_is_adams_next_step():
    """Size 1, two steps with different gradients: theta takes step 1's gradient at step 2 (Adam's first step);
    w = theta + the second Adam step for step 2's gradient from the committed moments (not committed: the state
    still holds one step), with both bias corrections; a new learning rate rescales w's step."""
    g1 = torch.tensor([0.5, -2.0, 1.0, 0.0, 3.0, -0.25])
    g2 = torch.tensor([-1.0, 0.5, 1.0, 2.0, 0.0, 4.0])
    grid, mlp, opt, ex = _exchange(sparse=False)
    start = grid.detach().clone()
    _step(grid, mlp, opt, ex, g1, 1)
    spec = ex.speculative
    assert torch.equal(spec.anchor[0], start), "step 1 must not move theta (the grid's average is one step late)"
    # w after step 1: Adam's first step, m_hat = g1, v_hat = g1^2 -> lr * g1 / (|g1| + eps)
    torch.testing.assert_close(grid.detach(), start - LR * g1 / (g1.abs() + EPS))
    _step(grid, mlp, opt, ex, g2, 2)
    theta = start - LR * g1 / (g1.abs() + EPS)  # step 2 applied step 1's gradient (size 1: the average)
    torch.testing.assert_close(spec.anchor[0], theta)
    m1, v1 = (1 - B1) * g1, (1 - B2) * g1 * g1
    torch.testing.assert_close(opt.state[grid]["exp_avg"], m1, msg="the speculative step must not commit moments")
    m2, v2 = B1 * m1 + (1 - B1) * g2, B2 * v1 + (1 - B2) * g2 * g2
    w = theta - LR * (m2 / (1 - B1**2)) / ((v2 / (1 - B2**2)).sqrt() + EPS)
    torch.testing.assert_close(grid.detach(), w)
    wrong = theta - LR * m2 / (v2.sqrt() + EPS)  # no bias correction: must be told apart
    assert (grid.detach() - wrong).abs().max() > 1e-3
    for group in opt.param_groups:
        group["lr"] = LR / 4
    ex.zero_grad()  # the next step set its learning rate: w's step follows it
    torch.testing.assert_close(grid.detach(), theta + (w - theta) / 4)
    with ex.consensus():
        assert torch.equal(grid.detach(), spec.anchor[0]), "inside consensus the parameters hold theta"
    assert ex.anchored([grid, mlp]) == [spec.anchor[0], mlp] and torch.equal(ex.anchor_state()["grid"], theta)
    assert ex.flush(opt, None) and not spec.ahead, "the flush applies the last average to theta"


def test_sparse_rule_speculation():
    """tiny-cuda-nn's sparse rule: an entry whose own gradient is zero is not moved, and each entry's bias
    correction counts its own steps (entry 3 is touched first at step 2: its first step)."""
    g1 = torch.tensor([0.5, -2.0, 1.0, 0.0, 3.0, -0.25])
    g2 = torch.tensor([-1.0, 0.5, 1.0, 2.0, 0.0, 4.0])
    grid, mlp, opt, ex = _exchange(sparse=True)
    start = grid.detach().clone()
    _step(grid, mlp, opt, ex, g1, 1)
    _step(grid, mlp, opt, ex, g2, 2)
    theta = ex.speculative.anchor[0]
    first = start - LR * g1 / (g1.abs() + EPS) * (g1 != 0)
    torch.testing.assert_close(theta, first)
    m1, v1 = (1 - B1) * g1, (1 - B2) * g1 * g1
    m2, v2 = B1 * m1 + (1 - B1) * g2, B2 * v1 + (1 - B2) * g2 * g2
    t = (g1 != 0).float() + 1
    rate = LR * torch.sqrt(1 - B2**t) / (1 - B1**t)
    w = torch.where(g2 != 0, theta - rate * m2 / (v2.sqrt() + EPS), theta)
    torch.testing.assert_close(grid.detach(), w)
    assert grid.detach()[4] == theta[4], "an entry without a gradient must not move"


def _losses(scene_cache, out, steps: int, *more: str) -> list[float]:
    tr = Trainer.build(parse_args(tiny_cpu_args(scene_cache, out, "--n_steps", str(steps), *more)))
    losses = []
    for step in range(steps):
        res, _ = tr.step(step)
        tr.state.step = step + 1
        losses.append(float(res.loss))
    return losses


def test_one_rank_trains_like_every(scene_cache, tmp_path):
    """Size 1: the local gradient is the average, so the speculative w is what every holds: the same losses to
    float tolerance (plain delayed_grid's differ from step 2 on)."""
    steps = 10
    every = _losses(scene_cache, tmp_path / "e", steps)
    plain = _losses(scene_cache, tmp_path / "d", steps, "--grad_sync", "delayed_grid")
    comp = _losses(scene_cache, tmp_path / "c", steps, "--grad_sync", "delayed_grid", "--delay_compensation", "local")
    torch.testing.assert_close(torch.tensor(comp), torch.tensor(every), rtol=1e-5, atol=1e-7)
    off_comp = max(abs(a - b) for a, b in zip(comp, every))
    off_plain = max(abs(a - b) for a, b in zip(plain, every))
    assert off_plain > 1e-4 and off_comp < off_plain / 100, (off_comp, off_plain)
