"""``--grad_sync delayed | periodic`` (training/gradsync.py): options, size-1 behaviour, and real ranks."""

from __future__ import annotations

import pytest
import torch
from conftest import run_ranks, tensor_digest, tiny_cpu_args

from hvd_ngp.config import parse_args
from hvd_ngp.errors import ConfigError
from hvd_ngp.training.gradsync import DelayedAveraging, fp16_scale
from hvd_ngp.training.graphed import eligibility
from hvd_ngp.training.trainer import Trainer


def settings(*argv: str):
    return parse_args(["--device", "cpu", *argv]).comm


def test_modes_refuse_what_they_cannot_run():
    for argv, message in (
        (["--grad_sync", "delayed", "--model_parallel", "2"], "cannot run with --model_parallel 2"),
        (
            ["--grad_sync", "periodic", "--compression", "fp16"],
            "cannot run with --compression fp16; use --grad_sync delayed_grid",
        ),
        (
            ["--grad_sync", "delayed", "--compression", "fp16"],
            "cannot run with --compression fp16; use --grad_sync delayed_grid",
        ),
        (["--grad_sync", "delayed_grid", "--precision", "fp16"], "cannot run with --precision fp16"),
        (["--grad_sync", "delayed_grid", "--compression", "fp16", "--precision", "fp16"], "--precision fp16"),
        (["--grad_sync", "delayed", "--precision", "fp16"], "cannot run with --precision fp16"),
        (["--grad_sync", "delayed", "--reduce_op", "adasum"], "cannot run with --reduce_op adasum"),
        (["--sync_period", "4"], "--sync_period 4 needs --grad_sync periodic"),
        (["--grad_sync", "periodic", "--sync_period", "0"], "--sync_period must be >= 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            settings(*argv)
    with pytest.raises(ConfigError, match="--grad_sync delayed cannot run elastic"):
        settings("--grad_sync", "delayed").init_env({"HOROVOD_ELASTIC": "1"}, use_cuda=False)
    assert settings("--grad_sync", "periodic").sync_period == 8
    # the graphed step averages every step only: --cuda_graphs auto falls back, and says why
    why = eligibility(torch.device("cuda"), True, "bf16", 1, False, False, grad_sync="delayed")
    assert why == "--grad_sync delayed (the graphed step averages every step only)"
    assert eligibility(torch.device("cuda"), True, "bf16", 1, False, False) is None


def test_fp16_wire_settings_and_scale():
    """delayed_grid takes --compression fp16 as its own wire (no loss scaler); the scale is a power of two with
    bound * s < 2^15, and 1 for a zero or non-finite bound (never 0 or inf)."""
    wire = settings("--grad_sync", "delayed_grid", "--compression", "fp16")
    assert wire.compression == "fp16" and not wire.loss_scaled_compression
    assert settings("--compression", "fp16").loss_scaled_compression, "every keeps Horovod's compression + scaler"
    assert "fp16 wire" in wire.describe_sync() and "fp16" not in settings("--grad_sync", "delayed_grid").describe_sync()
    for bound, scale in ((1.0, 2.0**14), (0.75, 2.0**15), (3e-9, 2.0**43), (1e30, 2.0**-85), (1e-40, 2.0**100)):
        assert fp16_scale(torch.tensor(bound)).item() == scale, bound
    for bound in (0.0, float("inf"), float("nan"), -1.0):
        assert fp16_scale(torch.tensor(bound)).item() == 1.0, bound
    with pytest.raises(ValueError, match="needs fresh parameters"):
        DelayedAveraging([torch.nn.Parameter(torch.zeros(3))], None, wire="fp16")


def test_periodic_learning_rate_is_one_ranks_batch():
    """Delayed averages every rank's gradient (the batch of every); periodic steps on one rank's."""
    assert settings("--grad_sync", "delayed").lr_multiplier(4, 4, False) == pytest.approx(2.0)
    assert settings("--grad_sync", "delayed_grid").lr_multiplier(4, 4, False) == 1.0
    assert settings("--grad_sync", "delayed_grid", "--lr_scaling", "sqrt").lr_multiplier(4, 4, False) == 2.0
    assert settings("--grad_sync", "periodic").lr_multiplier(4, 4, False) == 1.0
    assert settings("--grad_sync", "periodic", "--backward_passes_per_step", "4").lr_multiplier(4, 4, False) == 2.0


def _train(scene_cache, out, steps, *more):
    tr = Trainer.build(parse_args(tiny_cpu_args(scene_cache, out, "--n_steps", str(steps), *more)))
    digests = [tensor_digest(tr.field.parameters())]
    for step in range(steps):
        tr.step(step)
        tr.state.step = step + 1
        digests.append(tensor_digest(tr.field.parameters()))
    return tr, digests


def test_one_rank(scene_cache, tmp_path):
    """Size 1: delayed still applies each gradient one step late (the delay's own cost can be measured on one
    GPU); periodic is plain training (averaging one rank is the identity)."""
    every, plain = _train(scene_cache, tmp_path / "e", 4)
    _, local = _train(scene_cache, tmp_path / "p", 4, "--grad_sync", "periodic", "--sync_period", "2")
    assert local == plain
    tr, late = _train(scene_cache, tmp_path / "d", 4, "--grad_sync", "delayed")
    assert late[1] == late[0] and late[2] != late[1] and late[2] != plain[2], "step 1 must not move the parameters"
    assert tr.exchange.pending == 4 and tr.exchange.flush(tr.optimizer, tr.guard) and tr.exchange.pending is None
    assert tensor_digest(tr.field.parameters()) != late[-1]
    tr, half = _train(scene_cache, tmp_path / "g", 4, "--grad_sync", "delayed_grid")
    grid = [tensor_digest(tr.field.encoding_parameters())]
    assert half[1] != half[0] and half[1] != late[1], "step 1 must move the MLPs (their average is not late)"
    assert tr.exchange.pending == 4 and tr.exchange.flush(tr.optimizer, tr.guard)
    assert tensor_digest(tr.field.encoding_parameters()) != grid[0], "the flush must apply the grid's last average"
    # the fp16 wire runs at size 1 too (encoded and decoded, no exchange): step 1 moves the MLPs alone, as fp32's;
    # from step 2 the grid takes the fp16-rounded gradient
    tr, wire = _train(scene_cache, tmp_path / "w", 3, "--grad_sync", "delayed_grid", "--compression", "fp16")
    assert tr.exchange.half is not None, "--compression fp16 with delayed_grid is the fp16 wire"
    assert wire[1] == half[1] and wire[2] != half[2], "the grid's step-1 gradient must travel on the fp16 wire"


@pytest.mark.parallel
@pytest.mark.parametrize(
    "controller,checks", [("gloo", "delayed,periodic,resume,fp16,fp16_resume,comp"), ("mpi", "delayed,fp16")]
)
def test_real_ranks(controller, checks, scene_cache, tmp_path):
    """Two ranks: delayed equals a hand-computed reference (Gloo and MPI: its allreduce is the asynchronous one);
    under Gloo also periodic syncs exactly every H steps and both resume bit-identically from a checkpoint
    (tests/parallel/check_gradsync.py; periodic's sync is ``dist.allreduce_many_``, run under MPI elsewhere).
    delayed_grid's fp16 wire equals its hand encoding bit for bit (Gloo and MPI: each sums fp16 its own way)
    and resumes exactly (Gloo). ``--delay_compensation local`` (Gloo, both wires): theta, Adam's state and the
    parameter average identical on both ranks after every step while w differs; its resume is exact."""
    proc = run_ranks(
        ["tests/parallel/check_gradsync.py", str(scene_cache), str(tmp_path / "out"), checks], controller=controller
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    names = {
        "delayed": ["delayed_reference", "delayed_grid_reference"],
        "periodic": ["periodic_sync"],
        "resume": ["exact_resume_delayed", "exact_resume_delayed_grid", "exact_resume_periodic"],
        "fp16": ["fp16_wire"],
        "fp16_resume": ["exact_resume_delayed_grid_fp16"],
        "comp": ["comp_ranks", "comp_fp16_ranks", "exact_resume_delayed_grid_comp"],
    }
    for check in checks.split(","):
        for name in names[check]:
            assert f"CHECK {name} OK" in out, out[-4000:]
