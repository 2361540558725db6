"""The trainer: one rank's built parts and its training step, and ``run``, which builds and loops.

``Trainer.build`` (collective) takes the parts from the builder (``training.builder.build_parts``:
runtime, scene, data pipeline, field, grid, optimizer, ray budget, checkpoints, stop signals, the step)
and resumes into them; ``Trainer.step`` is one training step (occupancy refresh when due, rays, the
step interface ``step.TrainingStep``); ``run`` builds, prepares the outputs and hands over to the run
loop (``training.loop``: logs, evaluations, checkpoints, stops, the time budget).
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field as dc_field, fields
from pathlib import Path
from typing import Callable

import torch

from .. import faultpoints
from ..cluster import dist, elastic
from ..cluster.comm import CommSettings
from ..config import validate
from ..data.sampler import RayBatch, RaySampler
from ..model.encoding import FAST_RENDERER_BACKENDS
from ..observe.memory import out_of_memory_as_error
from ..observe.metrics import COL
from ..observe.profiling import NULL_TIMER, StageTimer
from ..settings import EvalSettings, Settings, StepSettings
from ..state import checkpoint
from ..state.checkpoint import resume
from .ahead import Draw, DrawAhead
from .builder import Parts, build_parts
from .control import Watcher
from .evaluate import BACKGROUNDS, evaluate
from .graphed import GraphedGridUpdate, GraphedStep, set_learning_rate
from .grid_sync import update_grid
from .loop import RunResult, prepare_outputs, train
from .model_parallel import ModelParallel
from .step import StepInputs, StepResult

__all__ = ["RunResult", "Trainer", "as_settings", "run"]

STEP_HINT = "lower --target_samples (or marching.candidate_factor), or raise --gpu_memory_gb"
EVAL_HINT = (
    "evaluation chunks are planned from --gpu_memory_gb: when other processes share this GPU, set it to this "
    "process's share"
)


def as_settings(settings: Settings | argparse.Namespace) -> Settings:
    """The typed settings; a Namespace from ``config.parse_args`` (tools, tests) is validated into them here."""
    return settings if isinstance(settings, Settings) else validate(settings)


@dataclass
class Trainer(Parts):
    """Everything one rank's training steps need: the builder's ``Parts`` (collective: ``Trainer.build``), the
    settings the steps read, and the state between steps.

    ``state`` holds what a checkpoint saves (see ``trainstate``); ``sampler``, ``generator`` and
    ``start_step`` read through to it, because an elastic reset or a resume replaces them.
    """

    step_settings: StepSettings  # rays, seed, background, graphed-step modes
    eval_settings: EvalSettings  # test views, background, protocol
    comm: CommSettings  # gradient accumulation, the learning-rate rule
    budget_lr_factor: float = 1.0  # set by the run loop from the shared training clock (budget_lr_factor())
    mp_reports: list = dc_field(default_factory=list)  # per log interval (model parallel)
    ahead: DrawAhead | None = None  # --draw_ahead (graphed steps): the next step's rays, drawn early
    grid_graph: GraphedGridUpdate | None = None  # --graph_grid_update: the grid's update after warm-up, graphed
    # each step once its verdict is known: (result, ray count), at once or, with --defer_verdict, during the next
    # step or at ``settle``; the run loop sums the interval's losses and samples there
    on_settled: Callable[[StepResult, int], None] | None = None
    _unsettled: tuple | None = None  # (step, result, rays, n_rays) of a step whose verdict is deferred

    @property
    def sampler(self) -> RaySampler:
        return self.state.sampler

    @property
    def generator(self) -> torch.Generator:  # backgrounds and jitter, seeded by global rank
        return self.state.bg_gen

    @property
    def start_step(self) -> int:
        return self.state.step

    @property
    def graphed(self) -> GraphedStep | None:
        """The training step where it is the graphed one (drawing ahead, the grid graph and a deferred verdict
        need it), else None."""
        return self.training_step if isinstance(self.training_step, GraphedStep) else None

    @staticmethod
    def build(settings: Settings | argparse.Namespace) -> "Trainer":
        """The builder's parts (collective), the draw-ahead and grid-graph choices, then the resume (or the
        snapshot) loaded into them."""
        s = as_settings(settings)
        parts = build_parts(s)
        tr = Trainer(
            step_settings=s.step,
            eval_settings=s.eval,
            comm=s.runtime.comm,
            **{f.name: getattr(parts, f.name) for f in fields(Parts)},
        )
        tr.use_draw_ahead(s.step.draw_ahead)
        tr.use_grid_graph(s.step.graph_grid_update)
        out = s.output
        resume(
            tr.state,
            out.resume or out.load_snapshot,
            tr.ckpts,
            tr.reseed,
            elastic=dist.elastic(),
            expect=checkpoint.trained_on(s.model.blocks, tr.scene.digest()),
            allow_changes=out.allow_resume_changes,
        )
        if "data" in tr.state.progress:  # epoch, balance, error map and resolution of the resumed run
            tr.data.load_state_dict(tr.state.progress["data"])
        return tr

    def use_draw_ahead(self, mode: str) -> None:
        """``--draw_ahead``: draw each step's rays during the previous graphed step (``training.ahead``);
        only for a graphed step drawing from images on the device. ``auto``: wherever it can; ``on``: the
        log also says why not where it cannot; ``off``: never."""
        wanted = mode != "off"
        why_not = None if self.graphed is not None else "the step is not graphed (--cuda_graphs)"
        if why_not is None and not self.sampler.draws_on_device:
            why_not = "the images are not on the device (their batches are already prepared by a background thread)"
        if mode == "on" and why_not:
            dist.log(f"draw ahead: off ({why_not})")
        self.ahead = DrawAhead() if wanted and why_not is None else None
        self.state.before_pack = None if self.ahead is None else self.ahead.rewind

    def use_grid_graph(self, mode: str, capture: bool = True) -> None:
        """``--graph_grid_update``: the occupancy grid's updates after warm-up replayed as a CUDA graph
        (``GraphedGridUpdate``), where the step is graphed and the grid is not split into regions (``auto``
        and ``on``; with ``on`` the log says why not elsewhere). ``capture=False``: the same code without a
        graph (tests on the CPU)."""
        self.grid_graph = None
        if mode == "off":
            return
        why_not = "the step is not graphed (--cuda_graphs)" if self.graphed is None and capture else None
        why_not = why_not or ("model-parallel regions update their own parts" if self.mp is not None else None)
        if why_not:
            if mode == "on":
                dist.log(f"graphed grid update: off ({why_not})")
            return
        self.grid_graph = GraphedGridUpdate(
            self.grid, self.field.density, self.march.schedule.dt_min, self.step_settings.seed, capture=capture
        )

    def lr_multiplier(self) -> float:
        """The learning-rate rule (``--lr_scaling``) for the current world (an elastic one changes size)."""
        rt = dist.runtime()
        return self.comm.lr_multiplier(rt.size, rt.local_size, rt.device.type == "cuda")

    def reseed(self) -> None:
        """This rank's shard and fresh random streams for the current world and step (the world changed)."""
        rt = dist.runtime()
        if self.mp is not None:  # the replica's shard, the same on its K ranks
            g = self.mp.groups
            self.state.reseed(self.scene.train, self.step_settings.seed, g.replica, g.replicas, self.data.new_sampler)
            return
        self.state.reseed(self.scene.train, self.step_settings.seed, rt.rank, rt.size, self.data.new_sampler)

    def step(self, step: int, timer: StageTimer = NULL_TIMER) -> tuple[StepResult, int]:
        """Training step number ``step`` (0-based, collective): occupancy refresh when due, rays, the step
        (graphed, else eager or model-parallel), the ray budget. Returns the result and the number of rays
        it used."""
        timer.start()
        faultpoints.at_step(step + 1)  # test-only fault injection (HVD_NGP_FAULTS); a no-op otherwise
        for group in self.optimizer.param_groups:
            set_learning_rate(group, self.lr_at(step) * self.lr_multiplier() * self.budget_lr_factor)
        if self.march.update_due(step):
            self._update_grid(step)
            timer.mark("occupancy update")
        n_rays = self.budget.n_rays * self.comm.backward_passes_per_step  # the budget is per backward pass
        draw = None if self.ahead is None else self.ahead.take(step, n_rays, self.sampler, self.generator)
        draw = draw or self._draw(n_rays)
        rays = draw.rays
        timer.mark("sampling")
        graphed = self.graphed
        inputs = StepInputs(
            rays,
            draw.background,
            draw.jitter,
            step,
            self.data.loss_scale,
            timer,
            meanwhile=None if graphed is None or self.ahead is None else (lambda: self._draw_ahead(step + 1)),
            after_forward=self.settle if graphed is not None and graphed.defer_verdict else None,
        )
        with out_of_memory_as_error(f"training step (step {step + 1})", self.memory, STEP_HINT):
            res = self.training_step.run(inputs)
        faultpoints.slow_down(step + 1, res.n_samples)  # test hook, like faultpoints.at_step
        # drawing ahead: the count changes where it draws
        self.budget.update(self.training_step.budget_result(res), apply=self.ahead is None or self.mp is not None)
        if res.skipped is None:  # decided during the next step (its graph A launched) or by settle()
            self._unsettled = (step, res, rays, n_rays)
        else:
            self._finish(step, res, rays, n_rays)
        return res, n_rays

    def _update_grid(self, step: int) -> None:
        """The occupancy grid's refresh at ``step``: graphed after warm-up where it can be; model-parallel
        regions refresh the cells overlapping their box, shared among the region's copies."""
        seed = self.step_settings.seed
        if self.grid_graph is not None and step >= self.march.warmup_steps:
            self.grid_graph(step)
        elif self.mp is None:
            update_grid(self.grid, self.field.density, self.march.schedule.dt_min, step, self.march.warmup_steps, seed)
        else:
            g = self.mp.groups
            update_grid(
                self.grid,
                self.field.density,
                self.march.schedule.dt_min,
                step,
                self.march.warmup_steps,
                seed,
                box=self.mp.box,
                share=(g.replica, g.replicas),
            )

    def settle(self) -> None:
        """Finish the step whose verdict was deferred (``--defer_verdict``), if any: the guard's verdict (it may
        raise ``NonFiniteError``), the parameter average, the error map, ``on_settled``. The run loop calls it
        before it evaluates, writes a checkpoint or ends a log interval; the next step calls it after launching
        its graph A (the average then still reads this step's parameters: the optimizer graph comes after)."""
        if self._unsettled is not None:
            step, res, rays, n_rays = self._unsettled
            self._unsettled = None
            graphed = self.graphed
            assert graphed is not None, "only a graphed step defers its verdict"
            res.skipped = graphed.settle()
            self._finish(step, res, rays, n_rays)

    def _finish(self, step: int, res: StepResult, rays: RayBatch, n_rays: int) -> None:
        """After the verdict on ``step``: the average, the error map, ``on_settled``."""
        ema = self.state.ema
        if ema is not None and not res.skipped:  # every rank took this step (or none did)
            ema.update(self.exchange.anchored(ema.params) if self.exchange is not None else None)
        # the error map (a collective every N steps, on every rank; a skipped step's loss is not recorded)
        self.data.observe(step, rays, None if res.skipped else res.ray_loss, res.valid)
        if self.on_settled is not None:
            self.on_settled(res, n_rays)

    def _draw(self, n_rays: int) -> Draw:
        """``n_rays`` training rays with their backgrounds and marching jitter (this rank's streams)."""
        dev, background_name = self.rt.device, self.step_settings.train_background
        rays = self.data.sample(n_rays)
        if background_name == "random":  # also for opaque scenes: it teaches full opacity
            background = torch.rand((n_rays, 3), generator=self.generator, device=dev)
        else:
            background = torch.tensor(BACKGROUNDS.get(background_name, (0.0, 0.0, 0.0)), device=dev)
            background = background.expand(n_rays, 3)
        return Draw(rays, background, torch.rand(n_rays, generator=self.generator, device=dev))

    def _draw_ahead(self, step: int) -> None:
        """During the graphed step before ``step``: settle the ray count, then draw ``step``'s batch."""
        self.budget.settle()
        assert self.ahead is not None, "called as the graphed step's meanwhile only when drawing ahead"
        self.ahead.put(
            step, self.budget.n_rays * self.comm.backward_passes_per_step, self.sampler, self.generator, self._draw
        )

    def end_interval(self, table) -> None:
        """After the monitor's reduction (every rank): epoch, load balance and resolution for the next interval;
        the ray budget follows the balancer."""
        if self.mp is not None:  # collective: the exchange figures of every rank
            report = self.mp.interval_report(table, int(table[:, COL["steps"]].max()))
            self.mp_reports.append(report)
            dist.log(ModelParallel.describe_report(report))
            table = self.mp.replica_table(table)  # the pipeline deals rays to replicas
        for note in self.data.end_interval(table):
            dist.log(note)
        self.budget.follow(self.data.balancer)  # ray counts and the fast renderer's capacities

    def averaged_weights(self):
        """Context: the field holds its averaged weights (the ``Ema`` block) inside, the raw ones after."""
        return self.state.ema.swapped() if self.state.ema is not None else contextlib.nullcontext()

    def evaluate(self, n_views: int | None = None, save_dir: Path | None = None, n_save: int = 0) -> dict:
        """Test-split metrics with the averaged weights (collective), rendered within the memory budget; its
        peak memory is recorded as the "eval" phase and the cached blocks are released afterwards."""
        ev = self.eval_settings
        consensus = self.exchange.consensus() if self.exchange is not None else contextlib.nullcontext()
        with (
            consensus,
            self.averaged_weights(),
            self.meter.phase("eval"),
            out_of_memory_as_error("evaluation", self.memory, EVAL_HINT),
        ):
            return evaluate(
                self.field,
                self.grid,
                self.scene.test,
                self.march.render_schedule,
                self.march.early_termination,
                ev.eval_background,
                ev.n_eval_views if n_views is None else n_views,
                save_dir,
                n_save,
                fast=self.backend in FAST_RENDERER_BACKENDS and self.mp is None,
                protocol=ev.eval_protocol,
                budget=self.memory,
                parallel=self.mp,
                stops=self.stops.signals,
            )


def run(
    settings: Settings | argparse.Namespace,
    stop_after_eval: Callable[[int, float], bool] | None = None,
    attach: Callable[[Trainer], Watcher] | None = None,
) -> RunResult:
    """Train as ``settings`` say (every rank calls this); rank 0 prints and writes files.

    ``stop_after_eval(step, psnr)``: called after each evaluation during training; True ends training there (as
    a time budget does: the final evaluation follows). It must decide the same on every rank (the PSNR is).
    ``attach`` (the same on every rank, e.g. ``--viewer``): called on rank 0 only to start a live view of the
    training (``control.Watcher``); then every rank obeys its pause, resume and save requests
    (``control.RunControl``)."""
    s = as_settings(settings)
    tr = Trainer.build(s)
    lock = None
    try:
        out = s.output
        ckpt_dir = tr.ckpts.directory if out.checkpointing or tr.stops.signals else None  # a stop always checkpoints
        lock = elastic.startup_agree(
            lambda: prepare_outputs(out, s.loop.n_steps, ckpt_dir), "preparing the output folders"
        )
        return train(tr, s, stop_after_eval, attach)
    finally:
        tr.stops.uninstall()  # the default actions again (an in-process caller keeps its own handlers)
        if lock is not None:  # rank 0: the output folder is free again
            lock.release()
