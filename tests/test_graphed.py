"""The CUDA-graph training step (training.graphed): capacity planning, eligibility, checkpoint portability,
and its step body against train_step (on the CPU it runs eagerly under Triton's interpreter; on a GPU,
captured and replayed against --cuda_graphs off)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from conftest import INTERPRETER_ARGS, gpu_or_skip, run_ranks, tiny_cpu_args

from hvd_ngp.errors import ConfigError
from hvd_ngp.training.graphed import (
    RAY_QUANTUM,
    CaptureKey,
    GraphedStep,
    eligibility,
    ray_capacity,
    set_learning_rate,
    use_graphs,
)
from hvd_ngp.training.step import StepContext, StepInputs
from hvd_ngp.triton_support import triton_available


def test_ray_capacity_keeps_rows_while_the_count_fits_and_grows_with_headroom():
    assert ray_capacity(1000, None, 1 << 20) == RAY_QUANTUM
    assert ray_capacity(5000, None, 1 << 20) == 2 * RAY_QUANTUM  # 5000 x 1.25 = 6250 -> 8192
    assert ray_capacity(8000, 8192, 1 << 20) == 8192  # fits: no new capture
    assert ray_capacity(9000, 8192, 1 << 20) == 3 * RAY_QUANTUM  # outgrown: 11250 -> 12288
    assert ray_capacity(1 << 20, None, 1 << 20) == 1 << 20  # capped at max_rays (rounded up)
    assert ray_capacity(5000, None, 4096) >= 5000  # never below the count
    assert ray_capacity(100, None, 1 << 20, quantum=64) == 128
    with pytest.raises(ValueError):
        ray_capacity(0, None, 1 << 20)


def test_the_step_captures_again_exactly_when_its_capture_key_changes(scene_cache, tmp_path):
    """GraphedStep keys a capture on its input rows, the renderer's two buffer sizes and importance weights: a
    step whose key equals the last capture's replays it (a ray count that still fits the rows included); rows
    outgrown, either buffer size or weights changed, or a loaded optimizer state capture again, an equal
    configuration under an equal key. (Stand-ins for CUDA's graphs replay the captured body eagerly, and the
    body is a stub: what is checked is the bookkeeping of ``__call__``, not the step.)"""
    from types import SimpleNamespace

    from hvd_ngp.cluster.flatgrad import FlatGradients
    from hvd_ngp.config import parse_args
    from hvd_ngp.data.sampler import RayBatch
    from hvd_ngp.training.trainer import Trainer

    tr = Trainer.build(parse_args(tiny_cpu_args(scene_cache, tmp_path, "--n_steps", "1")))
    renderer = SimpleNamespace(candidate_capacity=4096, sample_capacity=1024)
    grads = FlatGradients(tr.field.named_parameters(), tail=tr.guard.width if tr.guard else 0)
    step = GraphedStep(replace(tr.step_context, renderer=renderer), grads, eager_steps=1)
    step.ray_quantum = 64
    rows = lambda: step.inputs["origins"].shape[0]  # noqa: E731
    step._forward_backward = lambda: (torch.zeros(5), torch.zeros(rows()), torch.zeros(rows(), dtype=torch.bool))
    step._update = lambda: None  # (a loaded state is capturable: Adam's step would refuse the CPU)

    class Replay:
        def __init__(self, body):
            self.replay = body

    captured = []

    def capture(key):
        captured.append(key)
        step.outputs = step._forward_backward()
        step.graphs, step.key = (
            (Replay(lambda: setattr(step, "outputs", step._forward_backward())), Replay(step._update)),
            key,
        )
        step.captures += 1

    step._capture = capture
    calls = [0]

    def call(n: int, weighted: bool = False) -> None:
        rays = RayBatch(
            torch.zeros(n, 3),
            torch.ones(n, 3),
            torch.zeros(n, 4),
            torch.arange(n),
            weight=torch.ones(n) if weighted else None,
        )
        res = step.run(StepInputs(rays, torch.zeros(3), torch.zeros(n), calls[0]))
        assert len(res.ray_loss) == n
        calls[0] += 1

    call(100)
    assert captured == [] and step.key is None  # the eager steps capture nothing
    call(100)
    first = CaptureKey(128, 4096, 1024, False)  # 100 rays x 1.25 -> 2 x 64 rows
    assert captured == [first] and step.key == first
    call(120)  # still fits the rows: the same key, a replay
    assert captured == [first]
    call(200)  # outgrown: 256 rows
    grown = CaptureKey(256, 4096, 1024, False)
    call(150)  # fits the new rows
    renderer.sample_capacity = 512
    call(150)
    fewer_samples = CaptureKey(256, 4096, 512, False)
    renderer.candidate_capacity = 2048
    call(150)
    fewer_candidates = CaptureKey(256, 2048, 512, False)
    call(150, weighted=True)
    assert "weight" in step.inputs
    call(150)  # back to unweighted: the key before, captured again
    assert "weight" not in step.inputs
    call(150)
    tr.optimizer.load_state_dict(tr.optimizer.state_dict())  # new optimizer state: a new capture, the same key
    assert step.key is None
    call(150)
    assert captured == [
        first,
        grown,
        fewer_samples,
        fewer_candidates,
        CaptureKey(256, 2048, 512, True),
        fewer_candidates,
        fewer_candidates,
    ]
    assert len(set(captured)) == 5 and step.key == fewer_candidates


def test_eligibility_names_every_reason():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert eligibility(cuda, True, "fp32", 1, False, False) is None
    assert eligibility(cuda, True, "bf16", 1, False, False) is None
    assert "CUDA" in eligibility(cpu, True, "fp32", 1, False, False)
    assert "renderer" in eligibility(cuda, False, "fp32", 1, False, False)
    assert "fp16" in eligibility(cuda, True, "fp16", 1, False, False)
    assert "accumulation" in eligibility(cuda, True, "fp32", 2, False, False)
    assert "elastic" in eligibility(cuda, True, "fp32", 1, True, False)
    assert "sparse" in eligibility(cuda, True, "fp32", 1, False, True)
    assert "scaler" in eligibility(cuda, True, "fp32", 1, False, False, scaled=True)
    assert "tcnn" in eligibility(cuda, True, "fp32", 1, False, False, backend="tcnn")
    both = eligibility(cpu, True, "fp32", 2, False, False)
    assert "CUDA" in both and "accumulation" in both


def test_a_graphed_step_refuses_a_context_it_cannot_capture():
    """The graphed step captures the fast renderer's fixed buffers, with no gradient scaler, accumulation or
    --grad_sync exchange (``eligibility`` keeps the trainer from asking for them): a context with any of them
    is a ValueError naming it, raised before any part is read (the capture-key test builds one that fits)."""
    from types import SimpleNamespace

    from hvd_ngp.training.model_parallel import ModelParallel

    fits = StepContext(None, None, None, None, None, renderer=SimpleNamespace(candidate_capacity=1, sample_capacity=1))
    for unfit, named in (
        (replace(fits, renderer=None), "the fast renderer"),
        (replace(fits, renderer=object.__new__(ModelParallel)), "the fast renderer"),  # only its type is read
        (replace(fits, scaler=SimpleNamespace()), "cannot take a gradient scaler$"),
        (replace(fits, backward_passes=2), "cannot take 2 backward passes$"),
        (replace(fits, exchange=SimpleNamespace(), backward_passes=3), "3 backward passes or a --grad_sync exchange$"),
    ):
        with pytest.raises(ValueError, match=named):
            GraphedStep(unfit, grads=None)


def test_cuda_graphs_option():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert use_graphs("auto", None, cuda) and use_graphs("on", None, cuda)
    assert not use_graphs("off", None, cuda) and not use_graphs("auto", "the device is not a CUDA GPU", cpu)
    with pytest.raises(ConfigError, match="--cuda_graphs on: .*not a CUDA GPU"):
        use_graphs("on", "the device is not a CUDA GPU", cpu)


def test_cuda_graphs_on_refused_on_a_cpu(scene_cache, tmp_path):
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    with pytest.raises(ConfigError, match="cannot be graphed here: the device is not a CUDA GPU"):
        Trainer.build(parse_args(tiny_cpu_args(scene_cache, tmp_path, "--n_steps", "1", "--cuda_graphs", "on")))


def test_learning_rate_tensor_is_filled_in_place_only_on_change():
    lr = torch.tensor(1e-2)
    group = {"lr": lr}
    set_learning_rate(group, 5e-3)
    assert group["lr"] is lr and float(lr) == pytest.approx(5e-3)
    version = lr._version
    set_learning_rate(group, 5e-3)
    assert lr._version == version  # unchanged value: no kernel
    plain = {"lr": 1e-2}
    set_learning_rate(plain, 2e-3)
    assert plain["lr"] == 2e-3


def _graphed(tr, eager_steps: int = 10**9, defer_verdict: bool = False) -> GraphedStep:
    from hvd_ngp.cluster.flatgrad import FlatGradients

    grads = FlatGradients(tr.field.named_parameters(), tail=tr.guard.width if tr.guard else 0)
    step = GraphedStep(tr.step_context, grads, eager_steps=eager_steps, defer_verdict=defer_verdict)
    step.ray_quantum = 64  # the interpreter marches every row: keep the padding small
    return step


def test_the_interpreter_blocks_cut_no_training_ray(scene_cache, tmp_path):
    """conftest.INTERPRETER_ARGS changes the march's cap and launch alone, and the tiny model's training rays stay
    under the cap."""
    from hvd_ngp.config import parse_args
    from hvd_ngp.render.volume import max_lanes
    from hvd_ngp.training.trainer import Trainer

    short, default = (
        Trainer.build(parse_args(tiny_cpu_args(scene_cache, tmp_path / name, "--n_steps", "1", *more)))
        for name, more in (("short", INTERPRETER_ARGS), ("default", []))
    )
    cut, full = short.march.schedule, default.march.schedule
    assert cut.max_steps == 128 and replace(cut, max_steps=4096) == full  # nothing else changes
    assert replace(short.march, schedule=full, eval_schedule=default.march.eval_schedule, launch=None) == replace(
        default.march, launch=None
    )
    assert max_lanes(cut, short.field.aabb) == max_lanes(full, default.field.aabb) < 128


needs_interpreter = pytest.mark.skipif(
    torch.cuda.is_available() or not triton_available("cpu"),
    reason="the step body under Triton's CPU interpreter (a GPU runs the replay test)",
)


#: the step before which ``_steps`` halves the renderer's buffers, and the steps of the runs compared with train_step
HALVE_AT, STEPS = 3, 5


def _step_trainer(scene_cache, out_dir):
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    return Trainer.build(
        parse_args(
            tiny_cpu_args(
                scene_cache,
                out_dir,
                "--n_steps",
                str(STEPS),
                "--backend",
                "triton",
                "--n_rays_init",
                "100",
                *INTERPRETER_ARGS,
            )
        )
    )


def _steps(tr, start: int, stop: int) -> list[tuple]:
    """Steps ``start`` to ``stop`` - 1 of ``tr`` (the budget's buffers halved before step ``HALVE_AT``): per step
    (loss, mse, (samples, candidates), valid rays, ray losses, valid mask, rays)."""
    out = []
    for i in range(start, stop):
        if i == HALVE_AT:
            tr.budget.sample_capacity //= 2
            tr.budget.candidate_capacity //= 2
        res, n_rays = tr.step(i)
        tr.budget.settle()
        out.append(
            (
                float(res.loss),
                float(res.mse),
                (int(res.n_samples), int(res.n_candidates)),
                int(res.n_valid),
                res.ray_loss.clone(),
                res.valid.clone(),
                n_rays,
            )
        )
    return out


@pytest.fixture(scope="module")
def train_step_reference(scene_cache, tmp_path_factory):
    """train_step (eager) for ``STEPS`` steps, the reference of the two tests below (shared: under the
    interpreter it costs as much as the step body's run of either): (each step's results as ``_steps``
    gives them, the parameters after the steps before ``HALVE_AT``)."""
    tr = _step_trainer(scene_cache, tmp_path_factory.mktemp("train_step"))
    assert tr.graphed is None  # auto on a CPU: eager
    before = _steps(tr, 0, HALVE_AT)
    params = [p.detach().clone() for p in tr.field.parameters()]
    return before + _steps(tr, HALVE_AT, STEPS), params


@needs_interpreter
def test_step_body_equals_train_step(train_step_reference, scene_cache, tmp_path):
    """The graphed step's body, run eagerly: padded rows parked outside the box, flat gradients, device-side
    guard flags; the same losses, sample counts, ray losses and parameters as train_step for 3 steps."""
    from hvd_ngp.data.sampler import image_rays

    tr = _step_trainer(scene_cache, tmp_path)
    assert tr.graphed is None  # auto on a CPU: eager
    tr.training_step = _graphed(tr)
    # rows past each step's rays hold real camera rays through the object: unless parked, they march
    tr.graphed._allocate(128, False)
    o, d = image_rays(tr.scene.train, 0, torch.device("cpu"))
    middle = o.shape[0] // 2 + tr.scene.train.image_size(0)[0] // 2
    tr.graphed.inputs["origins"].copy_(o[middle - 64 : middle + 64])
    tr.graphed.inputs["directions"].copy_(d[middle - 64 : middle + 64])
    got = _steps(tr, 0, HALVE_AT)
    assert tr.graphed.inputs["origins"].shape[0] == 128 > got[0][6]  # padded rows were there, and parked
    got_params = [p.detach().clone() for p in tr.field.parameters()]
    ref, ref_params = train_step_reference[0][:HALVE_AT], train_step_reference[1]
    for (l0, m0, s0, v0, rl0, va0, n0), (l1, m1, s1, v1, rl1, va1, n1) in zip(ref, got, strict=True):
        assert n0 == n1 and s0 == s1 and min(s0) > 0 and v0 == v1
        assert l1 == pytest.approx(l0, rel=1e-5) and m1 == pytest.approx(m0, rel=1e-5)
        assert torch.equal(va0, va1) and torch.allclose(rl0, rl1, rtol=1e-5, atol=1e-8)
    for a, b in zip(ref_params, got_params, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


@needs_interpreter
def test_step_body_follows_train_step_across_a_change_of_buffer_sizes(train_step_reference, scene_cache, tmp_path):
    """The renderer's buffers halve after step 2 (the graphed step re-allocates its inputs; on a GPU it
    captures again): losses and sample counts stay those of train_step."""
    tr = _step_trainer(scene_cache, tmp_path)
    tr.training_step = _graphed(tr)
    ref, got = train_step_reference[0], _steps(tr, 0, STEPS)
    for (l0, _, counts0, _, _, _, n0), (l1, _, counts1, _, _, _, n1) in zip(ref, got, strict=True):
        assert counts0 == counts1 and n0 == n1 and l1 == pytest.approx(l0, rel=1e-5)
    assert ref[4][2][0] <= ref[0][2][0] // 2 + 64  # the halved buffers did cap the samples


@needs_interpreter
def test_non_finite_step_is_skipped_from_the_device_flag(scene_cache, tmp_path):
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    tr = Trainer.build(
        parse_args(tiny_cpu_args(scene_cache, tmp_path, "--n_steps", "2", "--backend", "triton", *INTERPRETER_ARGS))
    )
    tr.training_step = _graphed(tr)
    with torch.no_grad():
        tr.field.mlp_parameters()[0][0, 0] = math.nan
    before = [p.detach().clone() for p in tr.field.parameters()]
    res, _ = tr.step(0)
    assert res.skipped and tr.guard.skipped == [1]
    for a, b in zip(before, tr.field.parameters()):
        assert torch.equal(torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b.detach(), nan=7.0))  # untouched


FUSED_ADAM = '{"nested": {"nested": {"fused": true}}}'


def _poisoned_run(
    scene_cache,
    out_dir,
    steps: int,
    poisoned: set[int],
    *,
    defer: bool,
    limit: int = 10,
    started: list[int] | None = None,
):
    """The tiny model (fused Adam) through the graphed step's body for ``steps`` steps, the target colours of
    the steps in ``poisoned`` NaN: (trainer, losses, what ``on_settled`` saw, the guard's skips after each
    step). ``started``: each step's index is appended to it before the step runs."""
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    tr = Trainer.build(
        parse_args(
            tiny_cpu_args(
                scene_cache,
                out_dir,
                "--n_steps",
                str(steps),
                "--backend",
                "triton",
                "--optimizer",
                FUSED_ADAM,
                "--nonfinite_limit",
                str(limit),
                *INTERPRETER_ARGS,
            )
        )
    )
    tr.training_step = _graphed(tr, defer_verdict=defer)
    draw, step_now = tr._draw, [0]

    def poisoning_draw(n):
        d = draw(n)
        if step_now[0] in poisoned:
            d = replace(d, rays=replace(d.rays, rgba=torch.full_like(d.rays.rgba, math.nan)))
        return d

    tr._draw = poisoning_draw
    settled, skips, losses = [], [], []
    tr.on_settled = lambda res, n: settled.append((float(res.loss), res.skipped, n))
    for i in range(steps):
        step_now[0] = i
        if started is not None:
            started.append(i)
        res, _ = tr.step(i)
        losses.append(float(res.loss))
        skips.append(list(tr.guard.skipped))
    return tr, losses, settled, skips


@needs_interpreter
def test_a_deferred_verdict_skips_on_the_device_as_the_waiting_step_does(scene_cache, tmp_path):
    """--defer_verdict: fused Adam skips the poisoned step itself; the guard hears of it during the next step
    (or at settle); losses, parameters, the parameter average and what the run loop sums equal the waiting
    step's, bit for bit."""
    runs = {defer: _poisoned_run(scene_cache, tmp_path / str(defer), 3, {1}, defer=defer) for defer in (False, True)}
    (wait, wait_losses, wait_settled, wait_skips), (defer, defer_losses, defer_settled, defer_skips) = runs.values()
    assert wait_skips == [[], [2], [2]]
    assert defer_skips == [[], [], [2]]  # step 2's verdict: read while step 3 ran
    assert len(defer_settled) == 2 and defer._unsettled is not None
    defer.settle()
    assert defer._unsettled is None and len(defer_settled) == 3
    assert [s[1:] for s in wait_settled] == [s[1:] for s in defer_settled] and wait_settled[1][1] is True
    assert torch.tensor(wait_losses).nan_to_num(7.0).tolist() == torch.tensor(defer_losses).nan_to_num(7.0).tolist()
    for a, b in zip(wait.field.parameters(), defer.field.parameters()):
        assert torch.equal(a, b) and torch.isfinite(a).all()
    assert wait.state.ema.count == defer.state.ema.count == 2
    assert all(torch.equal(a, b) for a, b in zip(wait.state.ema.average, defer.state.ema.average))


@needs_interpreter
@pytest.mark.parametrize(
    "optimizer,limit,flag,deferred,said",
    [
        (FUSED_ADAM, 10, "auto", True, False),
        (FUSED_ADAM, 10, "on", True, False),
        (FUSED_ADAM, 10, "off", False, False),
        (None, 10, "auto", False, False),
        (None, 10, "on", False, True),
        (FUSED_ADAM, 0, "on", False, True),
    ],
)
def test_the_verdict_is_deferred_by_default_wherever_it_can_be(
    scene_cache, tmp_path, capsys, optimizer, limit, flag, deferred, said
):
    """--defer_verdict auto (the default) defers wherever fused Adam and a guard allow, silently elsewhere; on says
    in the log why it cannot; off never defers."""
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    assert parse_args([]).defer_verdict == "auto"
    extra = ["--optimizer", optimizer] if optimizer else []
    tr = Trainer.build(
        parse_args(
            tiny_cpu_args(
                scene_cache, tmp_path, "--n_steps", "1", "--backend", "triton", "--nonfinite_limit", str(limit), *extra
            )
        )
    )
    capsys.readouterr()
    step = GraphedStep.build(tr.step_context, "none", 1 << 12, defer_verdict=flag)
    assert step.defer_verdict is deferred
    assert ("deferred verdict: off (" in capsys.readouterr().err) is said


@needs_interpreter
def test_a_deferred_verdict_stops_at_the_limit_naming_the_same_steps(scene_cache, tmp_path):
    """Non-finite steps 2 and 3 with a limit of 2: the waiting step raises during step 3, the deferred one
    during step 4 (reading step 3's verdict), with the same message."""
    from hvd_ngp.state.failures import NonFiniteError

    for defer, raised_in in ((False, 2), (True, 3)):
        started: list[int] = []
        with pytest.raises(NonFiniteError, match=r"2 consecutive steps \(2-3\)"):
            _poisoned_run(scene_cache, tmp_path / str(defer), 5, {1, 2}, defer=defer, limit=2, started=started)
        assert started[-1] == raised_in


def test_only_fused_adam_with_a_guard_can_defer_the_verdict():
    """why_not_deferred names what is missing; the graphed step refuses a deferral it cannot do."""
    from hvd_ngp.state.failures import NonFiniteGuard
    from hvd_ngp.training.graphed import why_not_deferred

    p = torch.nn.Parameter(torch.zeros(2))
    fused, foreach = torch.optim.Adam([p], fused=True), torch.optim.Adam([p])
    guard = NonFiniteGuard(3)
    assert why_not_deferred(fused, guard) is None
    assert "no non-finite guard" in why_not_deferred(fused, None)
    assert "not torch's fused Adam" in why_not_deferred(foreach, guard)
    sparse = torch.optim.Adam([{"params": [p], "sparse": True}], fused=True)
    assert "sparse hash-table updates" in why_not_deferred(sparse, guard)


class OrderedHorovod:
    """Logs submissions and waits to ``events``; an average of identical ranks leaves each tensor as it is."""

    Average, Sum = "Average", "Sum"

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def allreduce_async_(self, tensor, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0):
        self.events.append(f"submit {name}")
        return name

    def synchronize(self, handle):
        self.events.append(f"wait {handle}")


@needs_interpreter
def test_allreduce_is_in_flight_while_meanwhile_runs(scene_cache, tmp_path, monkeypatch):
    """At 2 (fake) ranks: the stop flag is folded, the flat allreduce submitted, ``meanwhile`` run, then the
    allreduce waited for, in that order."""
    from hvd_ngp.cluster import dist
    from hvd_ngp.config import parse_args
    from hvd_ngp.state.failures import NonFiniteGuard
    from hvd_ngp.training.trainer import Trainer

    events: list[str] = []

    def stop_requested() -> bool:
        events.append("stop flag")
        return False

    tr = Trainer.build(
        parse_args(tiny_cpu_args(scene_cache, tmp_path, "--n_steps", "1", "--backend", "triton", *INTERPRETER_ARGS))
    )
    tr.step_context = replace(tr.step_context, guard=NonFiniteGuard(3, stop_requested=stop_requested))
    tr.training_step = _graphed(tr)
    draw = tr._draw(tr.budget.n_rays)
    monkeypatch.setattr(dist, "_hvd", OrderedHorovod(events))
    monkeypatch.setattr(dist, "_runtime", dist.Runtime(0, 2, 0, 2, 1, torch.device("cpu"), "gloo"))
    res = tr.graphed.run(
        StepInputs(draw.rays, draw.background, draw.jitter, 0, meanwhile=lambda: events.append("meanwhile"))
    )
    names = [f"flatgrad.{str(dt).removeprefix('torch.')}" for dt in tr.graphed.grads.buffers]
    assert events == ["stop flag", *(f"submit {n}" for n in names), "meanwhile", *(f"wait {n}" for n in names)]
    assert not res.skipped and tr.guard.stop_agreed is False


@needs_interpreter
def test_checkpoints_of_a_graphed_optimizer_load_anywhere(scene_cache, tmp_path):
    """state_dict() writes what a plain Adam writes (float learning rates, host step counts); loading it
    back keeps the learning-rate tensors the graph reads and asks for a new capture."""
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    trs = [
        Trainer.build(
            parse_args(
                tiny_cpu_args(
                    scene_cache, tmp_path / str(i), "--n_steps", "2", "--backend", "triton", *INTERPRETER_ARGS
                )
            )
        )
        for i in range(2)
    ]
    graphed = _graphed(trs[1])
    trs[1].training_step = graphed
    trs[1].step(0)
    lr = [g["lr"] for g in trs[1].optimizer.param_groups]
    state = trs[1].optimizer.state_dict()
    assert all(
        isinstance(g["lr"], float) and g["capturable"] is False and "_lr_value" not in g for g in state["param_groups"]
    )
    assert all(not v["step"].is_cuda for v in state["state"].values())
    trs[0].optimizer.load_state_dict(state)  # an eager optimizer takes it
    graphed.key = CaptureKey(1, 1, 1, False)
    trs[1].optimizer.load_state_dict(state)
    assert [g["lr"] for g in trs[1].optimizer.param_groups] == lr and all(
        g["lr"] is t for g, t in zip(trs[1].optimizer.param_groups, lr)
    )
    assert graphed.key is None and graphed.graphs is None


def test_graph_replay_follows_the_eager_step_on_a_gpu(scene_cache, tmp_path):
    """200 steps of the built-in scene with --cuda_graphs on against off, same seed, with a change of the
    renderer's buffer sizes at step 100 (a new capture): the loss curves agree as closely as two eager
    runs of the same seed agree with each other (the GPU's own run-to-run tolerance), or to 3%; the same with
    the verdict deferred (fused Adam skipping on the device)."""
    gpu_or_skip()
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    curves, captures = [], []
    for run, (mode, defer) in enumerate((("off", "off"), ("off", "off"), ("on", "off"), ("on", "on"))):
        args = parse_args(
            [
                "--scene_cache",
                str(scene_cache),
                "--device",
                "cuda",
                "--backend",
                "triton",
                "--n_steps",
                "200",
                "--cuda_graphs",
                mode,
                "--defer_verdict",
                defer,
                "--out_dir",
                str(tmp_path / f"{mode}{run}"),
            ]
        )
        tr = Trainer.build(args)
        assert (tr.graphed is not None) == (mode == "on")
        assert tr.graphed is None or tr.graphed.defer_verdict == (defer == "on")
        losses = []
        for i in range(200):
            if i == 100:  # the budget's buffers shrink: the graphed step must capture again
                tr.budget.sample_capacity = tr.budget.sample_capacity // 2
                tr.budget.candidate_capacity = tr.budget.candidate_capacity // 2
            res, _ = tr.step(i)
            tr.budget.settle()
            losses.append(float(res.loss))
        curves.append(torch.tensor(losses))
        captures.append(tr.graphed.captures if tr.graphed else 0)
    eager, eager_again, graph, deferred = curves
    assert captures[2] >= 2 and captures[3] >= 2  # the first capture and the one after the change
    assert torch.isfinite(graph).all() and torch.isfinite(deferred).all()
    # compare 20-step means; the hash grid's atomic adds make GPU runs of one seed drift apart (different
    # sample counts, then different ray counts and draws): two eager runs measure how far
    # apart; a graphed run may lie outside the band the two eager runs span by at most twice their spread
    windows = lambda c: c.view(10, 20).mean(dim=1)  # noqa: E731
    low, high = torch.minimum(windows(eager), windows(eager_again)), torch.maximum(windows(eager), windows(eager_again))
    spread = float(((high - low) / low).max())
    outside = lambda c: float(((windows(c) - high).clamp(min=0) + (low - windows(c)).clamp(min=0)).div(low).max())  # noqa: E731
    assert windows(graph)[-1] < 0.5 * windows(graph)[0], f"the graphed run did not learn: {windows(graph).tolist()}"
    for name, curve in (("graphed", graph), ("deferred-verdict", deferred)):
        off = outside(curve)
        assert off <= max(0.03, 2 * spread), (
            f"{name} 20-step mean losses lie up to {off:.3g} (relative) outside the two eager runs, which differ by up "
            f"to {spread:.3g}; eager {windows(eager).tolist()}, eager again {windows(eager_again).tolist()}, "
            f"{name} {windows(curve).tolist()}"
        )


# ------------------------------------------------------------------------------------------ the grid's update


def test_graphed_grid_update_needs_a_graphed_step_and_says_so(scene_cache, tmp_path, capsys):
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    assert parse_args([]).graph_grid_update == "auto"
    tr = Trainer.build(parse_args(tiny_cpu_args(scene_cache, tmp_path, "--n_steps", "1", "--graph_grid_update", "on")))
    assert tr.grid_graph is None
    assert "graphed grid update: off (the step is not graphed" in capsys.readouterr().err
    tr = Trainer.build(parse_args(tiny_cpu_args(scene_cache, tmp_path / "auto", "--n_steps", "1")))  # auto: silent
    assert tr.grid_graph is None and "graphed grid update" not in capsys.readouterr().err


def test_grid_update_through_fixed_buffers_trains_as_the_eager_update(scene_cache, tmp_path, monkeypatch):
    """GraphedGridUpdate's body without a graph (its random numbers drawn into buffers reused at every update,
    the merge after it) gives the eager update's grid and losses, bit for bit, across warm-up and 7 updates
    after it."""
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.graphed import GraphedGridUpdate
    from hvd_ngp.training.trainer import Trainer

    called, call = [], GraphedGridUpdate.__call__
    monkeypatch.setattr(GraphedGridUpdate, "__call__", lambda self, step: (called.append(step), call(self, step)))
    runs = []
    for fixed in (False, True):
        tr = Trainer.build(
            parse_args(
                tiny_cpu_args(
                    scene_cache,
                    tmp_path / str(fixed),
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
        runs.append((losses, tr.grid.density.clone(), tr.grid.occupied.clone()))
    (losses, density, occupied), (losses_fixed, density_fixed, occupied_fixed) = runs
    assert called == [8, 12, 16, 20, 24, 28, 32]
    assert losses == losses_fixed
    assert torch.equal(density, density_fixed) and torch.equal(occupied, occupied_fixed)
    assert 0 < float(occupied.float().mean()) < 1


@pytest.mark.parallel
def test_grid_update_through_fixed_buffers_on_two_ranks(scene_cache, tmp_path):
    """Its merge reduces the ranks' fresh values in place: the same grid on both ranks, as the eager update's.
    (Under MPI only: its Max allreduce is ``OccupancyGrid.merge``'s, which the eager grid update of every two-rank
    training run in the parallel tests also runs, under Gloo and MPI.)"""
    proc = run_ranks(
        ["tests/parallel/check_grid_update.py", str(scene_cache), str(tmp_path)], controller="mpi", timeout=240
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "CHECK grid_update OK (2 ranks)" in out, out[-4000:]


def test_graphed_grid_update_equals_the_eager_one_on_a_gpu(scene_cache, tmp_path):
    """The grid's update replayed as a CUDA graph against the eager update on the GPU, a real field whose
    weights change between updates (the replay must read them afresh): the same grid, bit for bit, after
    warm-up and 8 updates; one capture."""
    gpu_or_skip()
    import copy

    from hvd_ngp.config import parse_args
    from hvd_ngp.training.graphed import GraphedGridUpdate
    from hvd_ngp.training.trainer import Trainer

    tr = Trainer.build(
        parse_args(
            [
                "--scene_cache",
                str(scene_cache),
                "--device",
                "cuda",
                "--backend",
                "triton",
                "--n_steps",
                "1",
                "--out_dir",
                str(tmp_path),
            ]
        )
    )
    density = lambda x: tr.field.query_density(x)[0]  # noqa: E731
    eager, graphed = copy.deepcopy(tr.grid), copy.deepcopy(tr.grid)
    update = GraphedGridUpdate(graphed, density, 0.01, seed=3)
    for step in range(0, 160, 16):
        eager.update(density, 0.01, step, 32, 3)
        if step < 32:
            graphed.update(density, 0.01, step, 32, 3)
        else:
            update(step)
        torch.cuda.synchronize()
        assert torch.equal(eager.density, graphed.density), step
        assert torch.equal(eager.occupied, graphed.occupied), step
        with torch.no_grad():
            for p in tr.field.parameters():
                p.mul_(1.05)
    assert update.captures == 1
    assert 0 < float(graphed.occupied.float().mean()) < 1
