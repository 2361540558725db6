"""The builder: one rank's distributed runtime, scene, data pipeline, model and optimizer, from the settings.

``build_parts`` (collective) does what every rank must do in the same order before training: start
Horovod, load the scene and agree on it and on the settings, plan memory, build the data pipeline,
the field, grid, optimizer, ray budget, renderer, streams, checkpoints, stop signals and the step
(eager, graphed or model-parallel). ``training.trainer.Trainer.build`` then resumes into them.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, replace
from typing import Callable, cast

import torch

from ..cluster import dist, elastic, nccl_net, preempt
from ..cluster.consistency import agree_on_settings
from ..cluster.hvdtools import apply as apply_horovod_tools
from ..cluster.topology import nodes_of_size
from ..data import Scene, load_scene
from ..data.pipeline import DataPipeline
from ..launcher_env import launcher_sizes
from ..model.encoding import FAST_RENDERER_BACKENDS, resolve_backend
from ..model.field import NGPField
from ..observe.memory import (
    EVAL_RESERVE,
    MemoryBudget,
    MemoryMeter,
    check_fit,
    check_host_fit,
    host_memory,
    human_gib,
    ranks_on_device,
)
from ..render.occupancy import OccupancyGrid
from ..settings import Settings
from ..state.checkpoint import CheckpointManager
from ..state.failures import NonFiniteGuard
from ..state.trainstate import TrainState, make_rank_streams
from .budget import RayBudget
from .gradsync import Exchange, make_exchange
from .graphed import GraphedStep, eligibility, use_graphs
from .model_parallel import ModelParallel, hash_parameters, plan_partition, region_model
from .optim import OptimizerChain, make_ema
from .recipe import Marching, make_grid, make_loss, make_optimizer, make_scaler, model_footprint, resolve_precision
from .step import EagerStep, ModelParallelStep, Renderer, StepContext, TrainingStep


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@dataclass
class Parts:
    """What ``build_parts`` made (``training.trainer.Trainer`` holds it). The parts every step reads (field,
    grid, marching, optimizer, renderer, guard, exchange, precision) are the step context's, read through it."""

    rt: dist.Runtime
    backend: str
    scene: Scene
    lr_at: Callable[[int], float]  # the learning rate of a step (0-based), before the multipliers
    budget: RayBudget
    state: TrainState  # what a checkpoint saves
    ckpts: CheckpointManager
    data: DataPipeline  # placement, sampling strategy, balance; its sampler is ``state.sampler``
    memory: MemoryBudget  # what this process may hold on its device (--gpu_memory_gb)
    meter: MemoryMeter  # peak torch memory of the training step and of evaluation
    stops: preempt.StopVote  # agreed stop on signals
    step_context: StepContext  # what every step reads; built once, the same for the eager and the graphed step
    training_step: TrainingStep  # the one step this rank runs: eager, model-parallel or graphed (``build_step``)
    mp: ModelParallel | None  # --model_parallel K > 1: this rank's region and the segment exchange

    @property
    def field(self) -> NGPField:
        return self.step_context.field

    @property
    def grid(self) -> OccupancyGrid:
        return self.step_context.grid

    @property
    def march(self) -> Marching:
        return self.step_context.march

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.step_context.optimizer

    @property
    def renderer(self) -> Renderer | None:
        """The fast renderer, the model-parallel exchange, or None (the reference)."""
        return self.step_context.renderer

    @property
    def guard(self) -> NonFiniteGuard | None:
        return self.step_context.guard

    @property
    def exchange(self) -> Exchange | None:
        """``--grad_sync delayed | periodic``; None: every step."""
        return self.step_context.exchange

    @property
    def precision(self) -> str:
        """Resolved: fp32 | fp16 | bf16 (``recipe.resolve_precision``)."""
        return self.step_context.precision


def start_runtime(s: Settings) -> tuple[dist.Runtime, str]:
    """Horovod's tools and ``dist.init`` with the communication knobs, the start-up checks of the
    ``distributed`` block, and (across nodes) NCCL's report of its transport; returns the runtime and the
    compute backend resolved for its device. Collective."""
    comm = s.runtime.comm
    apply_horovod_tools(s.runtime)  # timeline/autotune/stall-check variables must precede Horovod's init
    wants_cuda = dist.wants_cuda(s.runtime.device)
    size, local_size = launcher_sizes(os.environ)
    across_nodes = wants_cuda and nodes_of_size(size, local_size) > 1  # NCCL's own report of its transport
    rt = dist.init(
        s.runtime.device,
        s.runtime.threads,
        env={**comm.init_env(os.environ, wants_cuda), **(nccl_net.capture_env(os.environ) if across_nodes else {})},
        model_parallel=comm.model_parallel,
    )
    use_cuda = rt.device.type == "cuda"
    notes = comm.check_runtime(rt.size, rt.local_size, rt.controller, use_cuda, os.environ)
    elastic.startup_agree(lambda: comm.block.check_host(rt.is_root), "checking the distributed block")
    torch.manual_seed(s.step.seed)  # identical model init everywhere (and broadcast from rank 0 anyway)
    backend = resolve_backend(s.model.backend, rt.device)
    dist.log(
        f"hvd_ngp: {rt.size} rank(s) [{rt.controller}{', elastic' if dist.elastic() else ''}], "
        f"device {device_name(rt.device)}, config {s.model.source}, backend {backend}, host {socket.gethostname()}"
    )
    if rt.size > 1 or comm.backward_passes_per_step > 1 or comm.grad_sync != "every":
        dist.log(comm.describe(os.environ, comm.lr_multiplier(rt.size, rt.local_size, use_cuda), rt.cross_size, notes))
    if use_cuda and rt.cross_size > 1:  # every rank: the first NCCL collective, then rank 0 reads NCCL's report
        dist.allreduce(torch.zeros(1, device=rt.device), "sum", name="nccl_net.probe")
        if rt.is_root:
            severity, text = nccl_net.verdict(nccl_net.parse(nccl_net.read_capture()), nccl_net.ib_devices())
            dist.log(f"warning: {text}" if severity == "warning" else text)
    return rt, backend


def load_agreed_scene(s: Settings) -> Scene:
    """The scene, loaded on every rank; outside elastic jobs every rank checks that all hold the same
    settings and scene (one allgather). Collective."""
    scene: Scene = elastic.startup_agree(
        lambda: load_scene(s.scene.scene, **s.scene.load_kwargs(), lazy_train=True), "loading the scene"
    )
    if not dist.elastic():  # one allgather: a rank with other settings or another scene stops every rank now
        agree_on_settings(shared_settings(s, scene), "settings")
    dist.log(
        f"scene {scene.source}: {len(scene.train)} train / {len(scene.test)} test views, "
        f"{scene.train.width}x{scene.train.height}, aabb_scale {scene.aabb_scale}"
        + (f", {scene.skipped_frames} frame(s) skipped: image missing" if scene.skipped_frames else "")
    )
    return scene


def plan_memory(s: Settings, rt: dist.Runtime, scene: Scene, model_k: dict) -> tuple[MemoryBudget, DataPipeline]:
    """The device memory budget, checked against the model's footprint, and the data pipeline with the
    images placed within what is left (host memory checked too). Collective."""
    groups = dist.groups()
    use_cuda = rt.device.type == "cuda"
    memory = elastic.startup_agree(
        lambda: MemoryBudget.for_device(
            rt.device,
            s.runtime.gpu_memory_gb,
            ranks_on_device(rt.local_rank, rt.local_size, torch.cuda.device_count() if use_cuda else 0),
        ),
        "planning GPU memory",
    )
    footprint = model_footprint(model_k, s.step.target_samples, scene)
    elastic.startup_agree(lambda: check_fit(memory, footprint, EVAL_RESERVE), "checking the GPU memory budget")
    image_room = None if memory.bytes is None else memory.bytes - footprint.total - EVAL_RESERVE
    # model parallel: rays are dealt to the D replicas, and the K ranks of a replica draw the same ones
    data_rt = replace(rt, rank=groups.replica, size=groups.replicas) if groups.enabled else rt
    data = DataPipeline.build(
        scene.train,
        s.data,
        data_rt,
        s.step.seed,
        s.step.target_samples,
        s.step.max_rays,
        s.scene.scene_cache,
        device_budget=image_room,
    )
    dist.log(data.describe())
    placed = data.placement
    host_images = placed.nbytes if placed.mode == "host" or (placed.mode == "device" and not use_cuda) else 0
    host_need = host_images + (0 if use_cuda else footprint.total)
    elastic.startup_agree(
        lambda: check_host_fit(
            host_need,
            host_memory(),
            rt.local_size,
            f"training images {human_gib(host_images)}"
            + ("" if use_cuda else f", model, optimizer and step buffers {human_gib(footprint.total)}"),
        ),
        "checking the host memory budget",
    )
    if memory.bytes is not None:
        images = data.placement.nbytes if data.placement.mode == "device" else 0
        dist.log(
            f"{'GPU memory' if use_cuda else 'memory'}: budget {human_gib(memory.bytes)} ({memory.source}); "
            f"training needs about {human_gib(footprint.total + images)} "
            f"({replace(footprint, images=images).describe()})"
        )
    return memory, data


def plan_model_parallel(s: Settings, scene: Scene, backend: str) -> ModelParallel | None:
    """``--model_parallel K`` > 1: this rank's region of the space split (None otherwise)."""
    groups = dist.groups()
    if not groups.enabled:
        return None
    blocks, source = s.model.blocks, s.model.source
    near = Marching.from_config(blocks["marching"], scene.aabb_scale, source).schedule.near
    mp = ModelParallel(
        groups,
        plan_partition(
            scene.train,
            scene.aabb,
            groups.model_parallel,
            int(blocks["marching"]["grid_resolution"]),
            near,
            f"{source}: --model_parallel {groups.model_parallel}",
        ),
    )
    dist.log(
        f"model parallel: {groups.replicas} replica(s) x {groups.model_parallel} regions "
        f"(rank = replica * {groups.model_parallel} + region); {mp.partition.describe()}"
    )
    if backend in FAST_RENDERER_BACKENDS:
        dist.log(f"model parallel: segments render with the reference marcher (the {backend} hash grid still encodes)")
    return mp


def build_model(
    s: Settings,
    rt: dist.Runtime,
    scene: Scene,
    model_k: dict,
    mp: ModelParallel | None,
    backend: str,
    precision: str,
    graphs: bool,
    chain: OptimizerChain,
) -> tuple:
    """Field, occupancy grid (unseen cells marked), marching recipe, optimizer (Horovod's where it averages
    every step), learning-rate schedule, loss and average, agreed by every rank. Collective."""
    comm, source = s.runtime.comm, s.model.source

    def build() -> tuple:
        field = NGPField(
            model_k, scene.aabb if mp is None else mp.box, backend, fused_training=precision in ("bf16", "fp16")
        ).to(rt.device)
        optimizer, lr_at = make_optimizer(field, model_k["optimizer"], source, capturable=graphs)
        return (
            field,
            make_grid(model_k["marching"], scene).to(rt.device),
            Marching.from_config(model_k["marching"], scene.aabb_scale, source),
            optimizer,
            lr_at,
            make_loss(model_k["loss"], source),
            make_ema(field, chain),
        )

    field, grid, march, optimizer, lr_at, loss_fn, ema = elastic.startup_agree(build, "building the model")
    seen = grid.mark_unseen(scene.train.c2w, scene.train.intrinsics, scene.train.sizes, march.schedule.near)
    dist.log(f"occupancy grid: {100 * seen:.1f}% of the cells are seen by a training camera")
    if not graphs and comm.grad_sync == "every":  # wrapped before any state is loaded into it (a graphed step
        # reduces flat gradients; --grad_sync delayed | periodic exchange through training.gradsync)
        optimizer = dist.distributed_optimizer(
            optimizer,
            field.named_parameters(),
            comm.compression,
            comm.backward_passes_per_step,
            comm.reduce_op,
            group="region" if mp is not None else None,
        )
    if mp is not None:
        counts = dist.allgather_object(hash_parameters(field), name="model_parallel.params")
        dist.log(
            f"model parallel: hash-grid parameters per rank {counts} ({human_gib(4 * counts[0])} fp32 on "
            f"rank 0; the configured table 2^{s.model.blocks['encoding'].get('log2_hashmap_size', 19)} split "
            f"over {mp.groups.model_parallel} regions)"
        )
    return field, grid, march, optimizer, lr_at, loss_fn, ema


def build_state(s: Settings, rt, scene, data, mp, field, grid, optimizer, scaler, budget, ema) -> TrainState:
    """The training state: model, optimizer, scaler, this rank's ray streams (a model-parallel rank draws its
    replica's), the ray budget and the parameter average; the region layout under model parallelism."""
    groups = dist.groups()
    stream_rank, stream_size = (groups.replica, groups.replicas) if mp is not None else (rt.rank, rt.size)
    streams = make_rank_streams(
        scene.train, s.step.seed, stream_rank, stream_size, rt.device, new_sampler=data.new_sampler
    )
    state = TrainState(field, grid, optimizer, scaler, *streams, budget, ema=ema)
    if mp is not None:
        state.layout = json.dumps({"model_parallel": groups.model_parallel, "partition": mp.partition.to_json()})
    return state


def build_step(s: Settings, graphs: bool, ctx: StepContext) -> TrainingStep:
    """The step from the one context: graphed (``graphs``: --cuda_graphs), else model-parallel (the renderer
    exchanges segments), else eager. The graphed step is made before the resume: its optimizer hooks keep a
    loaded state capturable."""
    if graphs:
        return GraphedStep.build(ctx, s.runtime.comm.compression, s.step.max_rays, s.step.defer_verdict)
    return ModelParallelStep(ctx) if isinstance(ctx.renderer, ModelParallel) else EagerStep(ctx)


def build_parts(s: Settings) -> Parts:
    """Everything one rank's training needs, in the order every rank builds it (collective)."""
    comm = s.runtime.comm
    rt, backend = start_runtime(s)
    groups = dist.groups()
    scene = load_agreed_scene(s)
    model_k = region_model(s.model.blocks, groups.model_parallel)  # this rank's model (one region's when K > 1)
    memory, data = plan_memory(s, rt, scene, model_k)
    mp = plan_model_parallel(s, scene, backend)
    fast = backend in FAST_RENDERER_BACKENDS and mp is None
    precision = resolve_precision(s.model.precision, rt.device, backend, mp is not None)
    scaler = make_scaler(precision, comm, rt.device, rt.size)
    chain = OptimizerChain.parse(model_k["optimizer"], s.model.source)
    sparse = bool(chain.adam.get("sparse_hash_updates", False))
    passes, elastic, scaled = comm.backward_passes_per_step, dist.elastic(), scaler is not None
    why_not = eligibility(rt.device, fast, precision, passes, elastic, sparse, scaled, backend, comm.grad_sync)
    graphs = use_graphs(s.step.cuda_graphs, why_not, rt.device)
    field, grid, march, optimizer, lr_at, loss_fn, ema = build_model(
        s, rt, scene, model_k, mp, backend, precision, graphs, chain
    )
    st = s.step
    budget = RayBudget(
        st.n_rays_init, st.target_samples, st.max_rays, march.candidate_factor if fast else None, st.sample_fill
    )
    renderer: Renderer | None = mp
    if fast:
        from ..render.fast import Capacities, FastRenderer

        # its buffer sizes are the budget's (made with a candidate factor on the fast path: both are ints)
        renderer = FastRenderer.following(cast(Capacities, budget), march.launch)
    state = build_state(s, rt, scene, data, mp, field, grid, optimizer, scaler, budget, ema)
    out = s.output
    ckpts = CheckpointManager(out.checkpoint_dir, out.ckpt_every, out.ckpt_keep)
    # stop signals (preempt): installed before the first collective of the resume, agreed in the loop
    stops = preempt.install(s.loop.stop_signals, dist.elastic())
    guard = (
        NonFiniteGuard(s.loop.nonfinite_limit, stops.local if stops.signals else None)
        if s.loop.nonfinite_limit
        else None
    )
    exchange = make_exchange(comm, field, optimizer, guard, ema)
    state.exchange = exchange
    ctx = StepContext(
        field,
        grid,
        optimizer,
        march,
        loss_fn,
        precision=precision,
        scaler=scaler,
        renderer=renderer,
        guard=guard,
        backward_passes=comm.backward_passes_per_step,
        weight_gradient=data.settings.importance_weights,
        exchange=exchange,
    )
    training_step = build_step(s, graphs, ctx)
    meter = MemoryMeter(rt.device)
    return Parts(rt, backend, scene, lr_at, budget, state, ckpts, data, memory, meter, stops, ctx, training_step, mp)


#: options that may differ between ranks: where each rank writes or caches (an MPMD launch gives each its own),
#: how many threads it uses, and paths whose content is compared instead (the scene by its digest)
PER_RANK_OPTIONS = (
    "out_dir",
    "metrics_json",
    "save_snapshot",
    "ckpt_dir",
    "scene_cache",
    "threads",
    "config",
    "scene",
    "load_snapshot",
    "resume",
)


def shared_settings(s: Settings, scene: Scene) -> dict:
    """What every rank must agree on: the resolved options and model blocks, and the scene's digest."""
    settings = {f"--{k}": v for k, v in s.flags.items() if k not in PER_RANK_OPTIONS and k != "model"}
    settings.update({f"{block} block": v for block, v in s.model.blocks.items() if not block.startswith("_")})
    settings["scene (digest of poses, intrinsics, sizes, names)"] = scene.digest()
    return settings
