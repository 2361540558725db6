"""The trainer: one rank's training, built from the arguments, and the run loop with its schedule.

``Trainer.build`` (collective) sets up the runtime, scene, data pipeline, field, grid, optimizer,
ray budget, checkpoints and stop signals; ``Trainer.step`` is one training step (occupancy refresh
when due, rays, ``step.train_step``); ``run`` loops over steps and, between them, logs intervals,
evaluates, writes checkpoints and obeys stops and the time budget, with the clocks, watchdog and
monitor paused around each evaluation and checkpoint (``paused``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from .. import faultpoints
from ..cluster import dist, elastic, nccl_net, preempt
from ..cluster.comm import CommSettings
from ..cluster.consistency import agree_on_settings
from ..cluster.hvdtools import apply as apply_horovod_tools
from ..cluster.topology import nodes_of_size
from ..launcher_env import launcher_sizes
from ..data import Scene, load_scene
from ..data.pipeline import DataPipeline
from ..data.sampler import RayBatch, RaySampler
from ..errors import ConfigError, OutputError, os_cause
from ..model.encoding import FAST_RENDERER_BACKENDS, resolve_backend
from ..model.field import NGPField
from ..observe.clock import TrainClock
from ..observe.memory import (EVAL_RESERVE, GIB, MemoryBudget, MemoryMeter, check_fit, check_host_fit, host_memory,
                              human_gib, out_of_memory_as_error, ranks_on_device)
from ..observe.monitor import Monitor
from ..observe.metrics import COL, UNLIMITED_STEPS
from ..observe.profiling import NULL_TIMER, StageTimer
from ..render.occupancy import OccupancyGrid
from ..state import checkpoint
from ..state.checkpoint import CheckpointManager, resume
from ..state.failures import NonFiniteGuard, Watchdog
from ..state.outputs import OutputLock, check_output_files, describe_owner
from ..state.trainstate import TrainState, make_rank_streams
from .ahead import Draw, DrawAhead
from .budget import RayBudget
from .gradsync import DelayedAveraging, PeriodicAveraging, make_exchange
from .control import RunControl, Watcher
from .graphed import GraphedGridUpdate, GraphedStep, eligibility, set_learning_rate, use_graphs
from .grid_sync import update_grid
from .evaluate import BACKGROUNDS, evaluate
from .model_parallel import ModelParallel, hash_parameters, plan_partition, region_model
from .optim import OptimizerChain, make_ema
from .recipe import (Marching, budget_lr_factor, make_grid, make_loss, make_optimizer, make_scaler, model_footprint,
                     resolve_precision)
from .step import StepResult, train_step

if TYPE_CHECKING:  # the fast renderer needs Triton: imported only when selected
    from ..render.fast import FastRenderer


STEP_HINT = "lower --target_samples (or marching.candidate_factor), or raise --gpu_memory_gb"
EVAL_HINT = ("evaluation chunks are planned from --gpu_memory_gb: when other processes share this GPU, set it to this "
             "process's share")


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@dataclass
class RunResult:
    """What a training run leaves behind (for tests and benchmarks that drive ``run`` in-process)."""

    field: NGPField
    grid: OccupancyGrid
    step: int
    metrics: dict
    stopped: str | None = None  # "SIGTERM on rank 1", ...: stopped early by a signal (exit EXIT_PREEMPTED)


@dataclass
class Trainer:
    """Everything one rank's training steps need, built by ``Trainer.build`` (collective).

    ``state`` holds what a checkpoint saves (see ``trainstate``); ``sampler``, ``generator`` and
    ``start_step`` read through to it, because an elastic reset or a resume replaces them.
    """

    args: argparse.Namespace
    rt: dist.Runtime
    backend: str
    scene: Scene
    field: NGPField
    grid: OccupancyGrid
    march: Marching
    optimizer: torch.optim.Optimizer
    lr_at: object
    loss_fn: object
    scaler: torch.amp.GradScaler | None
    renderer: "FastRenderer | None"
    budget: RayBudget
    state: TrainState
    ckpts: CheckpointManager
    guard: NonFiniteGuard | None
    data: DataPipeline  # placement, sampling strategy, balance; its sampler is ``state.sampler``
    memory: MemoryBudget  # what this process may hold on its device (--gpu_memory_gb)
    meter: MemoryMeter    # peak torch memory of the training step and of evaluation
    budget_lr_factor: float = 1.0  # set by the run loop from the shared training clock (budget_lr_factor())
    stops: preempt.StopVote = dc_field(default_factory=lambda: preempt.StopVote(None))  # agreed stop on signals
    graphed: GraphedStep | None = None  # the step as CUDA graphs (--cuda_graphs), else train_step
    mp: ModelParallel | None = None  # --model_parallel K > 1: this rank's region and the segment exchange
    mp_reports: list = dc_field(default_factory=list)  # per log interval (model parallel)
    ahead: DrawAhead | None = None  # --draw_ahead (graphed steps): the next step's rays, drawn early
    grid_graph: GraphedGridUpdate | None = None  # --graph_grid_update: the grid's update after warm-up, graphed
    # each step once its verdict is known: (result, ray count), at once or, with --defer_verdict, during the next
    # step or at ``settle``; the run loop sums the interval's losses and samples there
    on_settled: Callable[[StepResult, int], None] | None = None
    _unsettled: tuple | None = None  # (step, result, rays, n_rays) of a step whose verdict is deferred
    exchange: DelayedAveraging | PeriodicAveraging | None = None  # --grad_sync delayed | periodic; None: every

    @property
    def sampler(self) -> RaySampler:
        return self.state.sampler

    @property
    def generator(self) -> torch.Generator:  # backgrounds and jitter, seeded by global rank
        return self.state.bg_gen

    @property
    def start_step(self) -> int:
        return self.state.step

    @staticmethod
    def build(args: argparse.Namespace) -> "Trainer":
        comm: CommSettings = args.comm
        apply_horovod_tools(args)  # timeline/autotune/stall-check variables must precede Horovod's init
        wants_cuda = dist.wants_cuda(args.device)
        size, local_size = launcher_sizes(os.environ)
        across_nodes = wants_cuda and nodes_of_size(size, local_size) > 1  # NCCL's own report of its transport
        rt = dist.init(args.device, args.threads, env={**comm.init_env(os.environ, wants_cuda),
                                                      **(nccl_net.capture_env(os.environ) if across_nodes else {})},
                       model_parallel=comm.model_parallel)
        groups = dist.groups()
        use_cuda = rt.device.type == "cuda"
        notes = comm.check_runtime(rt.size, rt.local_size, rt.controller, use_cuda, os.environ)
        elastic.startup_agree(lambda: comm.block.check_host(rt.is_root), "checking the distributed block")
        torch.manual_seed(args.seed)  # identical model init everywhere (and broadcast from rank 0 anyway)
        source = args.model["_source"]
        backend = resolve_backend(args.backend, rt.device)
        dist.log(f"hvd_ngp: {rt.size} rank(s) [{rt.controller}{', elastic' if dist.elastic() else ''}], "
                 f"device {device_name(rt.device)}, config {source}, backend {backend}, host {socket.gethostname()}")
        if rt.size > 1 or comm.backward_passes_per_step > 1 or comm.grad_sync != "every":
            dist.log(comm.describe(os.environ, comm.lr_multiplier(rt.size, rt.local_size, use_cuda), rt.cross_size,
                                   notes))
        if use_cuda and rt.cross_size > 1:  # every rank: the first NCCL collective, then rank 0 reads NCCL's report
            dist.allreduce(torch.zeros(1, device=rt.device), "sum", name="nccl_net.probe")
            if rt.is_root:
                severity, text = nccl_net.verdict(nccl_net.parse(nccl_net.read_capture()), nccl_net.ib_devices())
                dist.log(f"warning: {text}" if severity == "warning" else text)
        scene: Scene = elastic.startup_agree(lambda: load_scene(
            args.scene, scene_cache=args.scene_cache, builtin_seed=args.builtin_seed, train_split=args.train_split,
            test_split=args.test_split, holdout_every=args.holdout_every, downscale=args.downscale,
            sharpness_threshold=args.sharpness_threshold, lazy_train=True, mask_mode=args.mask_mode),
            "loading the scene")
        if not dist.elastic():  # one allgather: a rank with other settings or another scene stops every rank now
            agree_on_settings(shared_settings(args, scene), "settings")
        dist.log(f"scene {scene.source}: {len(scene.train)} train / {len(scene.test)} test views, "
                 f"{scene.train.width}x{scene.train.height}, aabb_scale {scene.aabb_scale}"
                 + (f", {scene.skipped_frames} frame(s) skipped: image missing" if scene.skipped_frames else ""))
        memory = elastic.startup_agree(lambda: MemoryBudget.for_device(rt.device, args.gpu_memory_gb, ranks_on_device(
            rt.local_rank, rt.local_size, torch.cuda.device_count() if use_cuda else 0)), "planning GPU memory")
        model_k = region_model(args.model, groups.model_parallel)  # this rank's model (one region's when K > 1)
        footprint = model_footprint(args, scene, model_k)
        elastic.startup_agree(lambda: check_fit(memory, footprint, EVAL_RESERVE), "checking the GPU memory budget")
        image_room = None if memory.bytes is None else memory.bytes - footprint.total - EVAL_RESERVE
        # model parallel: rays are dealt to the D replicas, and the K ranks of a replica draw the same ones
        data_rt = replace(rt, rank=groups.replica, size=groups.replicas) if groups.enabled else rt
        data = DataPipeline.build(scene.train, args, data_rt, args.scene_cache, device_budget=image_room)
        dist.log(data.describe())
        placed = data.placement
        host_images = placed.nbytes if placed.mode == "host" or (placed.mode == "device" and not use_cuda) else 0
        host_need = host_images + (0 if use_cuda else footprint.total)
        elastic.startup_agree(lambda: check_host_fit(
            host_need, host_memory(), rt.local_size,
            f"training images {human_gib(host_images)}" + ("" if use_cuda else
                                                          f", model, optimizer and step buffers {human_gib(footprint.total)}")),
            "checking the host memory budget")
        if memory.bytes is not None:
            images = data.placement.nbytes if data.placement.mode == "device" else 0
            dist.log(f"{'GPU memory' if use_cuda else 'memory'}: budget {human_gib(memory.bytes)} ({memory.source}); training needs about "
                     f"{human_gib(footprint.total + images)} ({replace(footprint, images=images).describe()})")

        mp = None
        if groups.enabled:
            near = Marching.from_config(args.model["marching"], scene.aabb_scale, source).schedule.near
            mp = ModelParallel(groups, plan_partition(scene.train, scene.aabb, groups.model_parallel,
                                                      int(args.model["marching"]["grid_resolution"]), near,
                                                      f"{source}: --model_parallel {groups.model_parallel}"))
            dist.log(f"model parallel: {groups.replicas} replica(s) x {groups.model_parallel} regions "
                     f"(rank = replica * {groups.model_parallel} + region); {mp.partition.describe()}")
            if backend in FAST_RENDERER_BACKENDS:
                dist.log(f"model parallel: segments render with the reference marcher (the {backend} hash grid "
                         "still encodes)")
        fast = backend in FAST_RENDERER_BACKENDS and mp is None
        args.precision = resolve_precision(args.precision, rt.device, backend, mp is not None)
        scaler = make_scaler(args.precision, comm, rt.device, rt.size)
        chain = OptimizerChain.parse(model_k["optimizer"], source)
        sparse = bool(chain.adam.get("sparse_hash_updates", False))
        graphs = use_graphs(args.cuda_graphs, eligibility(rt.device, fast, args.precision, comm.backward_passes_per_step,
                                                          dist.elastic(), sparse, scaler is not None, backend,
                                                          comm.grad_sync),
                            rt.device)

        def build_model() -> tuple:
            model = model_k
            field = NGPField(model, scene.aabb if mp is None else mp.box, backend,
                             fused_training=args.precision in ("bf16", "fp16")).to(rt.device)
            optimizer, lr_at = make_optimizer(field, model["optimizer"], source, capturable=graphs)
            return (field, make_grid(model["marching"], scene).to(rt.device),
                    Marching.from_config(model["marching"], scene.aabb_scale, source), optimizer, lr_at,
                    make_loss(model["loss"], source), make_ema(field, chain))

        field, grid, march, optimizer, lr_at, loss_fn, ema = elastic.startup_agree(build_model, "building the model")
        seen = grid.mark_unseen(scene.train.c2w, scene.train.intrinsics, scene.train.sizes, march.schedule.near)
        dist.log(f"occupancy grid: {100 * seen:.1f}% of the cells are seen by a training camera")
        if not graphs and comm.grad_sync == "every":  # wrapped before any state is loaded into it (a graphed step
            # reduces flat gradients; --grad_sync delayed | periodic exchange through training.gradsync)
            optimizer = dist.distributed_optimizer(optimizer, field.named_parameters(), comm.compression,
                                                   comm.backward_passes_per_step, comm.reduce_op,
                                                   group="region" if mp is not None else None)
        if mp is not None:
            counts = dist.allgather_object(hash_parameters(field), name="model_parallel.params")
            dist.log(f"model parallel: hash-grid parameters per rank {counts} ({human_gib(4 * counts[0])} fp32 on "
                     f"rank 0; the configured table 2^{args.model['encoding'].get('log2_hashmap_size', 19)} split "
                     f"over {groups.model_parallel} regions)")

        budget = RayBudget(args.n_rays_init, args.target_samples, args.max_rays,
                           march.candidate_factor if fast else None,
                           args.sample_fill)
        renderer = mp
        if fast:
            from ..render.fast import FastRenderer

            renderer = FastRenderer.following(budget, march.launch)  # its buffer sizes are the budget's
        stream_rank, stream_size = (groups.replica, groups.replicas) if mp is not None else (rt.rank, rt.size)
        state = TrainState(field, grid, optimizer, scaler, *make_rank_streams(scene.train, args.seed, stream_rank,
                                                                               stream_size, rt.device,
                                                                               new_sampler=data.new_sampler),
                           budget, ema=ema)
        if mp is not None:
            state.layout = json.dumps({"model_parallel": groups.model_parallel, "partition": mp.partition.to_json()})
        ckpts = CheckpointManager(args.ckpt_dir or Path(args.out_dir) / "checkpoints", args.ckpt_every, args.ckpt_keep)
        # stop signals (preempt): installed before the first collective of the resume, agreed in the loop
        stops = preempt.install(getattr(args, "stop_signal_names", ()), dist.elastic())
        guard = NonFiniteGuard(args.nonfinite_limit, stops.local if stops.signals else None) \
            if args.nonfinite_limit else None
        exchange = make_exchange(comm, field, optimizer, guard, ema)
        state.exchange = exchange
        graphed = None  # made before the resume: its optimizer hooks keep a loaded state capturable
        if graphs:
            graphed = GraphedStep.build(field, grid, optimizer, march, loss_fn, renderer, guard, args.precision,
                                        data.settings.importance_weights, comm.compression, args.max_rays,
                                        args.defer_verdict)
        tr = Trainer(args, rt, backend, scene, field, grid, march, optimizer, lr_at, loss_fn, scaler, renderer, budget,
                     state, ckpts, guard, data, memory, MemoryMeter(rt.device), stops=stops, graphed=graphed, mp=mp,
                     exchange=exchange)
        tr.use_draw_ahead(args.draw_ahead)
        tr.use_grid_graph(args.graph_grid_update)
        resume(state, args.resume or args.load_snapshot, ckpts, tr.reseed, elastic=dist.elastic(),
               expect=checkpoint.trained_on(args.model, scene.digest()), allow_changes=args.allow_resume_changes)
        if "data" in state.progress:  # epoch, balance, error map and resolution of the resumed run
            data.load_state_dict(state.progress["data"])
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
        self.grid_graph = GraphedGridUpdate(self.grid, self.field.density,
                                            self.march.schedule.dt_min, self.args.seed, capture=capture)

    def lr_multiplier(self) -> float:
        """The learning-rate rule (``--lr_scaling``) for the current world (an elastic one changes size)."""
        rt = dist.runtime()
        return self.args.comm.lr_multiplier(rt.size, rt.local_size, rt.device.type == "cuda")

    def reseed(self) -> None:
        """This rank's shard and fresh random streams for the current world and step (the world changed)."""
        rt = dist.runtime()
        if self.mp is not None:  # the replica's shard, the same on its K ranks
            g = self.mp.groups
            self.state.reseed(self.scene.train, self.args.seed, g.replica, g.replicas, self.data.new_sampler)
            return
        self.state.reseed(self.scene.train, self.args.seed, rt.rank, rt.size, self.data.new_sampler)

    def step(self, step: int, timer: StageTimer = NULL_TIMER) -> tuple[StepResult, int]:
        """Training step number ``step`` (0-based, collective): occupancy refresh when due, rays, render,
        update. Returns the result and the number of rays it used."""
        args = self.args
        timer.start()
        faultpoints.at_step(step + 1)  # test-only fault injection (HVD_NGP_FAULTS); a no-op otherwise
        for group in self.optimizer.param_groups:
            set_learning_rate(group, self.lr_at(step) * self.lr_multiplier() * self.budget_lr_factor)
        if self.march.update_due(step):
            if self.grid_graph is not None and step >= self.march.warmup_steps:
                self.grid_graph(step)
            elif self.mp is None:
                update_grid(self.grid, self.field.density, self.march.schedule.dt_min, step,
                            self.march.warmup_steps, args.seed)
            else:  # each region refreshes the cells overlapping its box, shared among its copies
                g = self.mp.groups
                update_grid(self.grid, self.field.density, self.march.schedule.dt_min, step,
                            self.march.warmup_steps, args.seed, box=self.mp.box, share=(g.replica, g.replicas))
            timer.mark("occupancy update")
        n_rays = self.budget.n_rays * self.args.comm.backward_passes_per_step  # the budget is per backward pass
        draw = None if self.ahead is None else self.ahead.take(step, n_rays, self.sampler, self.generator)
        draw = draw or self._draw(n_rays)
        rays, background, jitter = draw.rays, draw.background, draw.jitter
        timer.mark("sampling")
        with out_of_memory_as_error(f"training step (step {step + 1})", self.memory, STEP_HINT):
            if self.graphed is not None:
                meanwhile = None if self.ahead is None else (lambda: self._draw_ahead(step + 1))
                res = self.graphed(rays, background, jitter, step, self.data.loss_scale, timer, meanwhile,
                                   self.settle if self.graphed.defer_verdict else None)
            else:
                res = train_step(self.field, self.grid, self.optimizer, rays, background, self.march, self.loss_fn,
                                 jitter, args.precision, self.scaler, self.renderer, timer,
                                 args.comm.backward_passes_per_step, self.guard, step + 1,
                                 self.data.settings.importance_weights, self.data.loss_scale, self.exchange)
        faultpoints.slow_down(step + 1, res.n_samples)  # test hook, like faultpoints.at_step
        if self.mp is None:
            self.budget.update(res, apply=self.ahead is None)  # drawing ahead: the count changes where it draws
        else:  # the replica's K ranks adapt to the same count, so they keep drawing the same rays
            self.budget.update(replace(res, n_samples=self.mp.take_step_samples(), counts=None))
        if res.skipped is None:  # decided during the next step (its graph A launched) or by settle()
            self._unsettled = (step, res, rays, n_rays)
        else:
            self._finish(step, res, rays, n_rays)
        return res, n_rays

    def settle(self) -> None:
        """Finish the step whose verdict was deferred (``--defer_verdict``), if any: the guard's verdict (it may
        raise ``NonFiniteError``), the parameter average, the error map, ``on_settled``. The run loop calls it
        before it evaluates, writes a checkpoint or ends a log interval; the next step calls it after launching
        its graph A (the average then still reads this step's parameters: the optimizer graph comes after)."""
        if self._unsettled is not None:
            step, res, rays, n_rays = self._unsettled
            self._unsettled = None
            res.skipped = self.graphed.settle()
            self._finish(step, res, rays, n_rays)

    def _finish(self, step: int, res: StepResult, rays: RayBatch, n_rays: int) -> None:
        """After the verdict on ``step``: the average, the error map, ``on_settled``."""
        if self.state.ema is not None and not res.skipped:  # every rank took this step (or none did)
            self.state.ema.update()
        # the error map (a collective every N steps, on every rank; a skipped step's loss is not recorded)
        self.data.observe(step, rays, None if res.skipped else res.ray_loss, res.valid)
        if self.on_settled is not None:
            self.on_settled(res, n_rays)

    def _draw(self, n_rays: int) -> Draw:
        """``n_rays`` training rays with their backgrounds and marching jitter (this rank's streams)."""
        args, dev = self.args, self.rt.device
        rays = self.data.sample(n_rays)
        if args.train_background == "random":  # also for opaque scenes: it teaches full opacity
            background = torch.rand((n_rays, 3), generator=self.generator, device=dev)
        else:
            background = torch.tensor(BACKGROUNDS.get(args.train_background, (0.0, 0.0, 0.0)), device=dev)
            background = background.expand(n_rays, 3)
        return Draw(rays, background, torch.rand(n_rays, generator=self.generator, device=dev))

    def _draw_ahead(self, step: int) -> None:
        """During the graphed step before ``step``: settle the ray count, then draw ``step``'s batch."""
        self.budget.settle()
        self.ahead.put(step, self.budget.n_rays * self.args.comm.backward_passes_per_step, self.sampler,
                       self.generator, self._draw)

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
        consensus = self.exchange.consensus() if self.exchange is not None else contextlib.nullcontext()
        with consensus, self.averaged_weights(), self.meter.phase("eval"), \
                out_of_memory_as_error("evaluation", self.memory, EVAL_HINT):
            return evaluate(self.field, self.grid, self.scene.test, self.march.render_schedule,
                            self.march.early_termination,
                            self.args.eval_background, self.args.n_eval_views if n_views is None else n_views,
                            save_dir, n_save, fast=self.backend in FAST_RENDERER_BACKENDS and self.mp is None,
                            protocol=self.args.eval_protocol, budget=self.memory, parallel=self.mp,
                            stops=self.stops.signals)


def run(args: argparse.Namespace, stop_after_eval: Callable[[int, float], bool] | None = None,
        attach: Callable[[Trainer], Watcher] | None = None) -> RunResult:
    """Train as ``args`` say (every rank calls this); rank 0 prints and writes files.

    ``stop_after_eval(step, psnr)``: called after each evaluation during training; True ends training there (as
    a time budget does: the final evaluation follows). It must decide the same on every rank (the PSNR is).
    ``attach`` (the same on every rank, e.g. ``--viewer``): called on rank 0 only to start a live view of the
    training (``control.Watcher``); then every rank obeys its pause, resume and save requests
    (``control.RunControl``)."""
    tr = Trainer.build(args)
    lock = None
    try:
        ckpt_dir = tr.ckpts.directory if checkpointing(args) or tr.stops.signals else None  # a stop always checkpoints
        lock = elastic.startup_agree(lambda: prepare_outputs(args, ckpt_dir), "preparing the output folders")
        return train(tr, args, stop_after_eval, attach)
    finally:
        tr.stops.uninstall()  # the default actions again (an in-process caller keeps its own handlers)
        if lock is not None:  # rank 0: the output folder is free again
            lock.release()


def train(tr: Trainer, args: argparse.Namespace, stop_after_eval: Callable[[int, float], bool] | None = None,
          attach: Callable[[Trainer], Watcher] | None = None) -> RunResult:
    """The run loop of ``run`` after start-up (every rank), with the output folder prepared and locked
    (``stop_after_eval``, ``attach``: as for ``run``)."""
    rt, scene, field, grid, march, backend, ts = tr.rt, tr.scene, tr.field, tr.grid, tr.march, tr.backend, tr.state
    source = args.model["_source"]
    out_dir = Path(args.out_dir)
    config = {"args": vars_for_json(args), "trained_on": checkpoint.trained_on(args.model, scene.digest())}

    length = (f"{args.n_steps} steps" + (f" (or {args.time_budget_s:g} s)" if args.time_budget_s else "")
              if args.n_steps < UNLIMITED_STEPS else f"for {args.time_budget_s:g} s")
    dist.log(f"training {length}"
             + f", {args.target_samples} samples/step/rank, MLPs in {args.precision}"
               f"{' (fused kernels)' if getattr(field.density_mlp, 'train_fused', False) else ''}, "
               f"grid {grid.resolution}^3 x {grid.n_cascades}, "
               f"dt {march.schedule.dt_min:.5f}..{march.schedule.dt_max:.5f}, cone {march.schedule.cone_angle:.5f}"
               + (f", evaluations at dt {march.eval_schedule.dt_min:.5f}" if march.eval_schedule else ""))

    # ts.progress, saved in checkpoints: "history" (one entry per log interval), "curve" (test PSNR/SSIM
    # against training time, with each evaluation's wall seconds), "total_samples", "train_seconds" (training
    # time before this process)
    progress = ts.progress
    for key, empty in (("history", []), ("curve", []), ("total_samples", 0.0), ("train_seconds", 0.0)):
        progress.setdefault(key, empty)
    monitor = elastic.startup_agree(lambda: Monitor(args.monitor, args.n_steps, tr.start_step,
                                                    memory=tr.meter), "starting the monitor")
    clock = TrainClock(rt.device, already=progress["train_seconds"])
    watchdog = Watchdog(args.watchdog_s, rt.rank).start()
    last_timed_ckpt = [progress["train_seconds"]]  # a shared clock reading: the same on every rank

    def write_checkpoint(step: int) -> Path:
        tr.settle()  # a deferred verdict: the average and the error map of the last step first
        with paused(clock, watchdog, monitor):
            progress["train_seconds"] = clock.shared_seconds()
            progress["data"] = tr.data.state_dict()
            path = tr.ckpts.write(ts, config)
        dist.log(f"[step {step}] checkpoint {path}")
        return path

    watcher = None
    if attach is not None:
        watcher = dist.agree(lambda: attach(tr) if rt.is_root else None, "starting the viewer")
    control = None if attach is None else RunControl(watcher, tr.stops.local)

    def obey(step: int, stats) -> None:
        """The viewer's requests, agreed by every rank after ``step`` (collective when due): a save writes a
        checkpoint; a pause holds every rank (off the training clock) until rank 0 resumes."""
        asked = control.poll(step)
        while asked is not None:
            if asked.save:
                write_checkpoint(step)
                stats.started += clock.last_pause
            if not asked.pause or asked.stop:
                return
            dist.log(f"[step {step}] paused from the viewer")
            with paused(clock, watchdog, monitor):
                asked = control.wait()
            stats.started += clock.last_pause
            if not asked.pause:
                dist.log(f"[step {step}] resumed after {clock.last_pause:.1f} s")

    stopped: list[str] = []  # set when a stop signal was agreed (preempt)

    def stop_with_checkpoint(step: int, during: str = "") -> None:
        """Every rank agreed to stop (a signal, or the launcher gone): checkpoint, marker, then exit 75."""
        who = tr.stops.who()
        dist.log(f"[step {step}] stop requested ({who}){during}: writing a checkpoint, then exiting with status "
                 f"{preempt.EXIT_PREEMPTED} (resume with --resume auto)")
        path = write_checkpoint(step)
        dist.agree(lambda: preempt.write_marker(out_dir, step, args.n_steps, who, path), "writing the stop marker")
        stopped.append(who)
    set_up = [False]  # this process's first step taken (outside the training clock: see first_step)

    def first_step(stats) -> None:
        """The process's first step, off the training clock and the monitor's interval (the watchdog stays
        armed): on a GPU it compiles the Triton kernels when their cache is cold (about 15 s on one H200),
        which is set-up, like loading the scene, not training time in a --time_budget_s. Its samples are
        left out of the interval as well (settled here, before ``on_settled`` is back), so samples/s stays
        samples over the time they took."""
        keep, tr.on_settled = tr.on_settled, None
        try:
            with clock.paused(), monitor.paused():
                tr.step(ts.step)
                tr.settle()
        finally:
            tr.on_settled = keep
        stats.started += clock.last_pause
        set_up[0] = True
        dist.log(f"[step {ts.step + 1}] first step {clock.last_pause:.1f} s, not counted in the training time "
                 f"(kernel compilation and warm-up; compiled kernels are cached for later runs)")

    def train_loop(commit: Callable[[], None] | None = None) -> None:
        """Steps from ``ts.step`` to the end; re-entered after an elastic reset."""
        eval_at = sorted(t for t in args.eval_at_s if t > progress["train_seconds"])
        tr.budget_lr_factor = budget_lr_factor(progress["train_seconds"], args.time_budget_s, args.budget_lr_decay)
        stats = monitor.new_interval()

        def add(res: StepResult, n_rays: int) -> None:  # each step once its verdict is known (Trainer.settle)
            if not res.skipped:
                stats.add(res.loss, res.mse, n_rays, res.n_samples)

        tr.on_settled = add
        with watchdog.armed():
            while ts.step < args.n_steps:
                if set_up[0]:
                    tr.step(ts.step)
                else:
                    first_step(stats)
                ts.step = step = ts.step + 1
                watchdog.kick(step)
                monitor.tick()
                # a stop signal on any rank (preempt): agreed through this step's non-finite-guard allreduce
                # (or a tiny allreduce every 8 steps), so every rank stops after the same step
                if tr.stops.decide(step, tr.guard) and step < args.n_steps:
                    stop_with_checkpoint(step)
                    break

                if step % args.log_every == 0 or step == args.n_steps:
                    tr.settle()
                    seconds = clock.seconds()
                    r = monitor.end_interval(step, stats, seconds, grid.occupancy_fraction())  # collective; rank 0 prints
                    if watcher is not None:
                        watcher.record(step, {"loss": r["loss"], "train_psnr": r["train_psnr"]})
                    tr.end_interval(monitor.table)
                    progress["total_samples"] += r["samples"]
                    progress["history"].append({
                        "step": step, "seconds": round(seconds, 3), "loss": r["loss"], "train_psnr": r["train_psnr"],
                        "samples_per_sec": r["samples_per_s"], "rays_per_step": r["rays_per_step"],
                        "step_time_spread": r["step_time_spread"], "gpu_util_spread": r["gpu_util_spread"],
                        **{k: r[k] for k in ("interval_s", "comm_fraction", "gpu_util", "energy_j")}})
                    stats = monitor.new_interval()
                # Evaluation points, the time budget and timed checkpoints, decided from one shared clock
                # reading every 8 steps.
                due = ((args.eval_every and step % args.eval_every == 0) or step in args.eval_at_steps) \
                    and step < args.n_steps
                ckpt_due = tr.ckpts.due_by_steps(step)
                stop = False
                if (eval_at or args.time_budget_s or args.ckpt_every_minutes) and step % 8 == 0:
                    elapsed = clock.shared_seconds()
                    due = due or bool(eval_at and elapsed >= eval_at[0])
                    eval_at = [t for t in eval_at if t > elapsed]
                    stop = bool(args.time_budget_s and elapsed >= args.time_budget_s)
                    tr.budget_lr_factor = budget_lr_factor(elapsed, args.time_budget_s, args.budget_lr_decay)
                    if args.ckpt_every_minutes and elapsed - last_timed_ckpt[0] >= 60 * args.ckpt_every_minutes:
                        ckpt_due, last_timed_ckpt[0] = True, elapsed
                if due and not stop:
                    tr.settle()
                    seconds = clock.seconds()
                    with paused(clock, watchdog, monitor):
                        ev = tr.evaluate()
                    stats.started += clock.last_pause
                    if ev.get("stopped"):  # a stop request cut the evaluation short
                        stop_with_checkpoint(step, " during an evaluation")
                        break
                    progress["curve"].append({"step": step, "seconds": round(seconds, 3), "psnr": ev["psnr"],
                                              "ssim": ev["ssim"], "eval_seconds": round(clock.last_pause, 3)})
                    dist.log(f"[step {step}] test PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} "
                             f"views at {seconds:.1f} s (evaluation {clock.last_pause:.1f} s)")
                    stop = stop_after_eval is not None and stop_after_eval(step, ev["psnr"])
                    if watcher is not None:
                        watcher.record(step, {"test_psnr": ev["psnr"]})
                if ckpt_due or (stop and checkpointing(args)):
                    write_checkpoint(step)
                    stats.started += clock.last_pause
                if control is not None and not stop:
                    if watcher is not None:
                        watcher.after_step(step)  # rank 0 draws when a frame is due
                    obey(step, stats)
                if commit is not None:
                    commit()
                if stop:
                    break
        tr.settle()
        if stats.steps and not stopped:  # the partial interval before a time-budget stop
            progress["total_samples"] += monitor.end_interval(ts.step, stats, clock.seconds(),
                                                              grid.occupancy_fraction())["samples"]

    if dist.elastic():
        elastic.run(train_loop, tr.reseed, ts, args.commit_every)
    else:
        train_loop()
    watchdog.stop()
    monitor.close()
    if watcher is not None:
        watcher.close()
    rt, step = dist.runtime(), ts.step
    if stopped:  # a stop signal: the checkpoint is written; no final evaluation, exit EXIT_PREEMPTED now
        tr.data.close()
        dist.log(f"stopped at step {step} of {args.n_steps} on a signal ({stopped[0]}); checkpoint in "
                 f"{tr.ckpts.directory}; exit status {preempt.EXIT_PREEMPTED}")
        return RunResult(field, grid, step, {"steps": step, "stopped": stopped[0]}, stopped[0])
    train_seconds = progress["train_seconds"] = clock.seconds()
    if checkpointing(args) and step not in [s for s, _ in tr.ckpts.existing()]:
        write_checkpoint(step)  # a restartable run always ends with a checkpoint
    if tr.exchange is not None:  # after the last checkpoint: the delayed average applied, the ranks' models averaged
        if tr.exchange.flush(tr.optimizer, tr.guard) and ts.ema is not None:
            ts.ema.update()
    stream = tr.data.stream_report()
    tr.data.close()
    if stream:
        dist.log(stream)

    eval_started = time.perf_counter()
    ev = tr.evaluate(save_dir=out_dir / "renders", n_save=args.save_renders)
    if ev.get("stopped"):  # training is done, its final evaluation was cut short: a resume evaluates again
        stop_with_checkpoint(step, " during the final evaluation")
        dist.log(f"stopped after step {step} of {args.n_steps} on a signal ({stopped[0]}) before the final "
                 f"evaluation ended; checkpoint in {tr.ckpts.directory}; exit status {preempt.EXIT_PREEMPTED}")
        return RunResult(field, grid, step, {"steps": step, "stopped": stopped[0]}, stopped[0])
    progress["curve"].append({"step": step, "seconds": round(train_seconds, 3), "psnr": ev["psnr"], "ssim": ev["ssim"],
                              "eval_seconds": round(time.perf_counter() - eval_started, 3)})
    samples_per_sec = progress["total_samples"] / max(train_seconds, 1e-9)
    dist.log(f"done: {step} steps in {train_seconds:.1f} s, {samples_per_sec / 1e6:.3f} M samples/s, "
             f"test PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} views")
    if args.save_snapshot:
        checkpoint.save(ts, args.save_snapshot, config)
    metrics = {"world_size": rt.size, "steps": step, "train_seconds": round(train_seconds, 3),
               "samples_per_sec": samples_per_sec, "test_psnr": ev["psnr"], "test_ssim": ev["ssim"],
               "test_views": ev["views"], "psnr_per_view": ev.get("psnr_per_view", []), "curve": progress["curve"],
               "device": device_name(rt.device), "backend": backend, "precision": args.precision,
               "controller": rt.controller, "scene": scene.source, "config": source,
               "nonfinite_skipped_steps": tr.guard.skipped if tr.guard else None, "history": progress["history"],
               "communication": args.comm.summary(os.environ, tr.lr_multiplier()), "data": tr.data.summary(),
               "memory": {"budget_gib": None if tr.memory.bytes is None else round(tr.memory.bytes / GIB, 3),
                          "budget_source": tr.memory.source, "peak": tr.meter.summary()}}
    if tr.mp is not None:
        metrics["model_parallel"] = model_parallel_summary(tr)
    if rt.is_root:
        for path in [out_dir / "metrics.json"] + ([Path(args.metrics_json)] if args.metrics_json else []):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(metrics, indent=1))
            except OSError as exc:
                raise OutputError(f"{path}: cannot write the metrics: {os_cause(exc)}") from None
    return RunResult(field, grid, step, metrics)


def model_parallel_summary(tr: Trainer) -> dict:
    """Collective: the layout, every rank's parameter bytes and peak memory, and the interval reports."""
    g = tr.mp.groups
    mine = {"hash_params": hash_parameters(tr.field), "param_bytes": sum(p.numel() * p.element_size()
                                                                        for p in tr.field.parameters()),
            "peak_memory": tr.meter.summary()}
    ranks = dist.allgather_object(mine, name="model_parallel.summary")
    return {"model_parallel": g.model_parallel, "replicas": g.replicas, "partition": json.loads(tr.mp.partition.to_json()),
            "hash_params_per_rank": [r["hash_params"] for r in ranks],
            "param_bytes_per_rank": [r["param_bytes"] for r in ranks],
            "peak_memory_per_rank": [r["peak_memory"] for r in ranks], "intervals": tr.mp_reports}


@contextlib.contextmanager
def paused(clock: TrainClock, watchdog: Watchdog, monitor: Monitor) -> Iterator[None]:
    """Around an evaluation or a checkpoint: the training clock stops (``clock.last_pause`` holds how long
    afterwards), the watchdog waits, and the monitor leaves the block's collectives and GPU samples out."""
    with clock.paused(), watchdog.paused(), monitor.paused():
        yield


def checkpointing(args: argparse.Namespace) -> bool:
    """Periodic checkpoints are on (then a run also ends, or stops on its time budget, with one)."""
    return args.ckpt_every > 0 or args.ckpt_every_minutes > 0


def prepare_outputs(args: argparse.Namespace, ckpt_dir: Path | None) -> OutputLock | None:
    """Rank 0: create the output folders, lock the output folder for this run (``OutputLock``) and prove that
    every file the run writes can be written now, not after hours of training. Returns the lock (rank 0)."""
    if not dist.runtime().is_root:
        return None
    folders = [("output folder (--out_dir)", Path(args.out_dir))]
    if ckpt_dir is not None:
        folders.append(("checkpoint folder (--ckpt_dir)", ckpt_dir))
    for option in ("save_snapshot", "metrics_json"):
        if getattr(args, option):
            folders.append((f"folder of --{option}", Path(getattr(args, option)).parent))
    for what, folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise ConfigError(f"{folder}: cannot write to the {what}: {os_cause(exc)}") from None
    out_dir = Path(args.out_dir)
    lock = OutputLock.acquire(out_dir)
    try:
        files = [("metrics file", out_dir / "metrics.json"), ("stop marker", out_dir / preempt.MARKER)]
        files += [(f"file of --{option}", Path(getattr(args, option))) for option in ("save_snapshot", "metrics_json")
                  if getattr(args, option)]
        if ckpt_dir is not None:
            files.append(("checkpoint", ckpt_dir / f"ckpt-{args.n_steps:08d}.pt"))
        check_output_files(files)
    except ConfigError:
        lock.release()
        raise
    if lock.took_over:
        dist.log(f"{lock.path}: took over the lock of a run that ended without releasing it (crashed or killed: "
                 f"{describe_owner(lock.took_over)})")
    preempt.clear_marker(out_dir)  # a previous stop's marker: this run decides anew
    return lock


#: options that may differ between ranks: where each rank writes or caches (an MPMD launch gives each its own),
#: how many threads it uses, and paths whose content is compared instead (the scene by its digest)
PER_RANK_OPTIONS = ("out_dir", "metrics_json", "save_snapshot", "ckpt_dir", "scene_cache", "threads", "config", "scene",
                    "load_snapshot", "resume")


def shared_settings(args: argparse.Namespace, scene: Scene) -> dict:
    """What every rank must agree on: the resolved options and model blocks, and the scene's digest."""
    settings = {f"--{k}": v for k, v in vars_for_json(args).items() if k not in PER_RANK_OPTIONS and k != "model"}
    settings.update({f"{block} block": v for block, v in args.model.items() if not block.startswith("_")})
    settings["scene (digest of poses, intrinsics, sizes, names)"] = scene.digest()
    return settings


def vars_for_json(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, dict, list, type(None)))}


