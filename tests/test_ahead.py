"""Drawing the next step's rays ahead (training.ahead, --draw_ahead): a batch drawn ahead is the batch a
fresh draw would give, a stale one is un-drawn exactly, and checkpoints read the streams as if nothing
had been drawn ahead. The graphed step's body runs eagerly on the CPU under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from conftest import INTERPRETER_ARGS, tiny_cpu_args
from test_graphed import _graphed, needs_interpreter

from hvd_ngp.training.ahead import DrawAhead
from hvd_ngp.training.budget import RayBudget
from hvd_ngp.training.step import StepResult


def _trainer(scene_cache, out_dir, *more):
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    return Trainer.build(parse_args(tiny_cpu_args(scene_cache, out_dir, "--n_steps", "8", *more)))


def _same(a, b) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in (
            (a.rays.origins, b.rays.origins),
            (a.rays.directions, b.rays.directions),
            (a.rays.rgba, b.rays.rgba),
            (a.background, b.background),
            (a.jitter, b.jitter),
        )
    )


def test_a_stale_batch_is_undrawn_and_drawn_again_identically(scene_cache, tmp_path):
    tr = _trainer(scene_cache, tmp_path, "--train_background", "random")
    ahead = DrawAhead()
    ahead.put(3, 256, tr.sampler, tr.generator, tr._draw)
    first = ahead._ahead.draw
    assert ahead.take(2, 256, tr.sampler, tr.generator) is None and ahead.redrawn == 1  # another step: un-drawn
    assert _same(tr._draw(256), first)  # the fresh draw repeats the un-drawn random numbers
    ahead.put(3, 256, tr.sampler, tr.generator, tr._draw)
    assert ahead.take(3, 192, tr.sampler, tr.generator) is None  # another ray count
    ahead.put(3, 256, tr.sampler, tr.generator, tr._draw)
    tr.sampler.set_resolution(2)  # the sampler changed (its version): the batch no longer fits
    assert ahead.take(3, 256, tr.sampler, tr.generator) is None and ahead.redrawn == 3
    ahead.put(4, 128, tr.sampler, tr.generator, tr._draw)
    kept = ahead._ahead.draw
    assert ahead.take(4, 128, tr.sampler, tr.generator) is kept and ahead.used == 1
    assert ahead.take(4, 128, tr.sampler, tr.generator) is None  # taken once


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_draw_ahead_needs_a_graphed_step(mode, scene_cache, tmp_path, capsys):
    tr = _trainer(scene_cache, tmp_path / mode, "--draw_ahead", mode)
    assert tr.graphed is None and tr.ahead is None and tr.state.before_pack is None  # CPU: no graphs
    said = "draw ahead: off (the step is not graphed" in capsys.readouterr().err
    assert said == (mode == "on")  # the default (auto) says nothing; asked for, the log says why not


def test_counts_wait_for_settle_when_not_applied():
    def res(n):
        return StepResult(
            torch.tensor(0.1),
            torch.tensor(0.1),
            torch.tensor(float(n)),
            torch.tensor(float(4 * n)),
            torch.tensor(1000.0),
            False,
            None,
            None,
        )

    budget = RayBudget(4096, target=1 << 16, max_rays=1 << 20)
    budget.update(res(1 << 17), apply=False)
    assert budget.n_rays == 4096  # waits for settle
    budget.settle()
    assert budget.n_rays == 448  # 2^16 samples at 2^17 / 1000 per ray: 500 rays, in multiples of 64
    budget.update(res(1 << 15))
    assert budget.n_rays == 1984  # applied at once (nothing to wait for on the CPU)


def _run(scene_cache, out_dir, steps: int, *, ahead: bool, redraw_all: bool = False, last_ahead: bool = True):
    """The tiny model through the graphed step's body for ``steps`` steps: (losses, parameters, trainer)."""
    tr = _trainer(
        scene_cache,
        out_dir,
        "--backend",
        "triton",
        "--n_rays_init",
        "96",
        "--train_background",
        "random",
        *INTERPRETER_ARGS,
    )
    tr.training_step = _graphed(tr)
    tr.use_draw_ahead("auto" if ahead else "off")
    if redraw_all:  # every batch drawn ahead is un-drawn and drawn again at its step
        take = tr.ahead.take
        tr.ahead.take = lambda step, n, sampler, gen: (tr.ahead.rewind(), take(step, n, sampler, gen))[1]
    losses = []
    for i in range(steps):
        if i == steps - 1 and not last_ahead:
            tr._draw_ahead = lambda step: None  # the last step draws nothing ahead
        res, _ = tr.step(i)
        losses.append(float(res.loss))
    return losses, [p.detach().clone() for p in tr.field.parameters()], tr


#: steps of the runs below
STEPS = 4


@pytest.fixture(scope="module")
def drawn_ahead(scene_cache, tmp_path_factory):
    """The reference run, drawing each next batch ahead, shared by the tests below (it takes most of their
    time under the interpreter): (losses, parameters, trainer, batches drawn ahead and used, and redrawn)."""
    losses, params, tr = _run(scene_cache, tmp_path_factory.mktemp("ahead"), STEPS, ahead=True)
    return losses, params, tr, tr.ahead.used, tr.ahead.redrawn  # counts read before any test touches the trainer


@needs_interpreter
def test_rays_drawn_ahead_are_the_rays_drawn_in_place(drawn_ahead, scene_cache, tmp_path):
    """Training with batches drawn ahead equals training where each of them is un-drawn and drawn again."""
    ahead_losses, ahead_params, _, used, redrawn = drawn_ahead
    again_losses, again_params, tr_again = _run(scene_cache, tmp_path / "b", STEPS, ahead=True, redraw_all=True)
    assert used == 3 and redrawn == 0  # steps 1-3 took the batch drawn during the step before
    assert tr_again.ahead.used == 0
    assert ahead_losses == again_losses
    assert all(torch.equal(a, b) for a, b in zip(ahead_params, again_params))


@needs_interpreter
def test_checkpoint_streams_are_those_of_a_run_that_drew_nothing_ahead(drawn_ahead, scene_cache, tmp_path):
    """Packing the random streams un-draws the batch held for the next step: the bytes equal those of a run
    whose last step drew nothing ahead (generators and the settled ray count)."""
    held = drawn_ahead[2]
    _, _, none = _run(scene_cache, tmp_path / "b", STEPS, ahead=True, last_ahead=False)
    assert held.ahead._ahead is not None and none.ahead._ahead is None
    assert torch.equal(held.state.pack_streams(), none.state.pack_streams())
    assert held.ahead._ahead is None  # un-drawn: the next step draws afresh from the saved streams


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
