"""``python -m hvd_ngp.bench throughput``: training throughput per backend, side by side in one run.

For each backend (torch reference, Triton kernels, ...): train ``--warmup_steps`` steps so the
occupancy grid and the ray budget settle, then time ``--steps`` steps end to end (no per-step
synchronisation) and again with a per-stage breakdown (CUDA events; synchronises once per step).
Micro-benchmarks at ``--points`` points: the hash grid forward and forward+backward (torch eager,
torch.compile, Triton fp32 and fp16 tables, tiny-cuda-nn when installed) and the two MLPs
forward+backward+Adam (torch, torch.compile, the fused Triton MLPs, tiny-cuda-nn; ``python -m
hvd_ngp.bench mlp`` times the MLPs alone, per precision). Reports samples/s
(samples through the network with gradients), ratios to the torch reference, peak GPU memory.

After training, the ``inference`` rows (``bench/inference.py``, Triton backends): one view of the trained
field at ``--inference_size`` by the two-pass and the single-pass inference renderer side by side, ms per
view, rays/s and the single pass's stage breakdown.

Then ``--profile_steps`` more steps under torch.profiler (after one unmeasured step under it, so
the profiler's start-up is not counted): host-side kernel launches per step (the CUDA launch calls
in ``LAUNCH_CALLS``; a CUDA-graph replay is one ``cudaGraphLaunch``), device kernels per step, the
GPU busy share (union of the kernels' device intervals / wall time of the profiled steps; the
profiler slows the host, so on a launch-bound step this is a lower bound) and outermost aten
operators per step. On the CPU there are no launches: launches and GPU busy print "n/a" and the
aten operator count is the stand-in.

``--host_profile_steps`` more steps under cProfile: the host's own time per step in its costliest
functions (self time, cProfile's overhead included), which says where a launch-bound step spends the
host's time: Python, launches, or waiting for the device (``synchronize``, ``item``, ``tolist``).
"""

from __future__ import annotations

import argparse
import gc
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterable, NamedTuple, cast

import torch
from torch import Tensor

from ..cluster import dist
from ..config import BASE_CONFIG, CPU_CONFIG, parse_settings
from ..model.encoding import BACKENDS, FAST_RENDERER_BACKENDS, model_for_backend, resolve_backend
from ..model.encoding.hashgrid import MERGE_RUNS_BELOW, HashGridSpec, HashGridTorch
from ..model.encoding.tcnn import tcnn_available
from ..observe.profiling import StageTimer
from ..options import options_from
from ..settings import Settings
from ..training.trainer import Trainer
from ..triton_support import triton_available
from .report import append_markdown, table, write_json


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeat: int = 20, warmup: int = 3) -> float:
    """Mean milliseconds of ``fn()`` over ``repeat`` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / repeat * 1e3


#: host-side calls that put work on the GPU: runtime and driver kernel launches, CUDA-graph replays
LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cudaGraphLaunch",
        "cuGraphLaunch",
    }
)
WINDOW = "hvd_ngp.bench.profiled_steps"  # the record_function around the measured steps
_VERSION_SUFFIX = re.compile(r"_v\d+$")  # CUPTI's raw names: cudaLaunchKernel_v7000


def launch_call(name: str) -> str | None:
    """A host event's name -> the launch call it is (version suffix dropped), or None if it launches nothing."""
    call = _VERSION_SUFFIX.sub("", name)
    return call if call in LAUNCH_CALLS else None


class ProfEvent(NamedTuple):
    """One profiler event: ``activity`` as kineto names it (cpu_op, cuda_runtime, cuda_driver, kernel, ...);
    ``correlation`` links a launch call to the kernels it launched (0: unknown)."""

    name: str
    activity: str
    thread: int
    start_ns: int
    end_ns: int
    correlation: int = 0


def busy_share(intervals: Iterable[tuple[int, int]], start: int, end: int) -> float:
    """Length of the union of ``[s, e)`` intervals clipped to ``[start, end)``, over ``end - start``."""
    clipped = sorted((max(s, start), min(e, end)) for s, e in intervals if e > start and s < end)
    busy, cur_s, cur_e = 0, 0, None  # cur_s is read only once cur_e is set (the interval being grown)
    for s, e in clipped:
        if cur_e is None or s > cur_e:
            busy += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += 0 if cur_e is None else cur_e - cur_s
    return busy / (end - start) if end > start else 0.0


def outermost_aten_ops(events: Iterable[ProfEvent]) -> int:
    """``aten::`` operators not nested in another ``aten::`` operator of the same thread (what Python or
    autograd dispatched, not their decompositions)."""
    by_thread: dict[int, list[ProfEvent]] = defaultdict(list)
    for e in events:
        if e.activity == "cpu_op" and e.name.startswith("aten::"):
            by_thread[e.thread].append(e)
    count = 0
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e.start_ns, -e.end_ns))
        open_ends: list[int] = []  # end times of the aten ops enclosing the current one
        for e in evs:
            while open_ends and open_ends[-1] <= e.start_ns:
                open_ends.pop()
            count += not open_ends
            open_ends.append(e.end_ns)
    return count


def step_profile(events: list[ProfEvent], n_steps: int, cuda: bool) -> dict:
    """Per-step launch and busy figures from the events of ``n_steps`` steps inside the ``WINDOW`` annotation.

    -> launches_per_step, kernels_per_step, gpu_busy_share (None without CUDA), aten_ops_per_step,
    profiled_step_ms, profiled_steps, kernel_ms (device milliseconds per step by kernel name, the
    ``TOP_KERNELS`` longest, longest first; empty without CUDA).
    """
    # the host-side range (a CUDA build also mirrors it on the GPU's timeline: gpu_user_annotation)
    windows = [e for e in events if e.name == WINDOW and e.activity in ("user_annotation", "cpu_op")]
    if len(windows) != 1:
        raise RuntimeError(f"expected one {WINDOW!r} profiler range, found {len(windows)}")
    start, end = windows[0].start_ns, windows[0].end_ns
    # torch builds whose events lack activity_type() (``activity_of``) show the GPU mirrors of host ranges
    # (record_function: "Optimizer.step#Adam.step", ...) as kernels: a name the host also has is not a kernel
    host_names = {e.name for e in events if e.activity in ("cpu_op", "user_annotation")}
    inside = [
        e._replace(activity="gpu_user_annotation") if e.activity == "kernel" and e.name in host_names else e
        for e in events
        if start <= e.start_ns < end and e.name != WINDOW
    ]
    kernels = [(e.start_ns, e.end_ns) for e in inside if e.activity == "kernel"]
    launches = sum(launch_call(e.name) is not None for e in inside)
    return {
        "profiled_steps": n_steps,
        "profiled_step_ms": (end - start) / 1e6 / n_steps,
        "launches_per_step": launches / n_steps if cuda else None,
        "kernels_per_step": len(kernels) / n_steps if cuda else None,
        "gpu_busy_share": busy_share(kernels, start, end) if cuda else None,
        "aten_ops_per_step": outermost_aten_ops(inside) / n_steps,
        "kernel_ms": kernel_times(inside, n_steps) if cuda else {},
        "launch_sources": launch_sources(inside, n_steps) if cuda else {},
        **(kernel_timeline(inside, n_steps) if cuda else {"kernel_timeline": [], "kernel_gaps": {}}),
    }


SHORT_KERNEL_US = 10.0  # kernels shorter than this are counted apart in ``kernel_gaps``


def kernel_timeline(events: Iterable[ProfEvent], n_steps: int) -> dict:
    """The device's order of work: ``kernel_timeline``, every kernel in start order as ``[name (70 characters),
    microseconds idle before it, microseconds it ran]`` (the first one's idle counted from the previous kernel
    only); ``kernel_gaps``, per step: the idle milliseconds between kernels, the number of kernels and their
    milliseconds below ``SHORT_KERNEL_US``, and the idle gaps of more than 20 us with the kernel after each (the
    places where the device waited for the host, not for the launch of the next kernel)."""
    kernels = sorted((e for e in events if e.activity == "kernel"), key=lambda e: e.start_ns)
    timeline: list[list[Any]] = []  # [name, idle us, run us]
    long_gaps: defaultdict[str, float] = defaultdict(float)  # kernel name -> us idle before it per step
    idle_ns = 0
    end = None
    for e in kernels:
        gap = 0 if end is None else max(e.start_ns - end, 0)
        idle_ns += gap
        if gap > 20_000:
            long_gaps[e.name[:70]] += gap / 1e3 / n_steps
        timeline.append([e.name[:70], round(gap / 1e3, 2), round((e.end_ns - e.start_ns) / 1e3, 2)])
        end = e.end_ns if end is None else max(end, e.end_ns)
    short = [d for _, _, d in timeline if d < SHORT_KERNEL_US]
    return {
        "kernel_timeline": timeline,
        "kernel_gaps": {
            "idle_ms_per_step": idle_ns / 1e6 / n_steps,
            "short_kernels_per_step": len(short) / n_steps,
            "short_kernel_ms_per_step": sum(short) / 1e3 / n_steps,
            "idle_us_before_per_step": dict(sorted(long_gaps.items(), key=lambda kv: -kv[1])[:10]),
        },
    }


TOP_SOURCES = 20  # launch sources listed in the profile
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})


def launch_sources(events: list[ProfEvent], n_steps: int) -> dict[str, float]:
    """Host-side launches per step by where they came from (the ``TOP_SOURCES`` most frequent, most first):
    the outermost host operator or range around the launch call on its thread (``aten::copy_``,
    ``Optimizer.step#...``); outside any, "CUDA graph replay" for a graph launch, else the kernel launched
    (matched by correlation: Triton kernels, which Python launches directly), else the call's name. What
    the ``<= 10`` launches of issue 16 have to fold."""
    ranges: dict[int, list[ProfEvent]] = defaultdict(list)
    kernel_of: dict[int, str] = {}
    for e in events:
        if e.activity in ("cpu_op", "user_annotation"):
            ranges[e.thread].append(e)
        elif e.activity == "kernel" and e.correlation:
            kernel_of.setdefault(e.correlation, e.name)
    for evs in ranges.values():
        evs.sort(key=lambda e: (e.start_ns, -e.end_ns))  # an enclosing range before the ranges it holds
    counts: dict[str, int] = defaultdict(int)
    for e in events:
        call = launch_call(e.name)
        if call is None:
            continue
        outer = next((r for r in ranges.get(e.thread, ()) if r.start_ns <= e.start_ns and e.end_ns <= r.end_ns), None)
        if outer is not None:
            source = outer.name
        elif call in GRAPH_LAUNCHES:
            source = "CUDA graph replay"
        elif e.correlation in kernel_of:
            source = f"{kernel_of[e.correlation][:60]} (direct launch)"
        else:
            source = call
        counts[source[:80]] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_SOURCES]
    return {name: n / n_steps for name, n in ranked}


TOP_KERNELS = 25  # kernels listed by name in the profile


def kernel_times(events: Iterable[ProfEvent], n_steps: int) -> dict[str, float]:
    """Device milliseconds per step of each kernel name (the ``TOP_KERNELS`` longest, longest first;
    names cut to 90 characters, so template instances of one kernel may merge)."""
    total: dict[str, int] = defaultdict(int)
    for e in events:
        if e.activity == "kernel":
            total[e.name[:90]] += e.end_ns - e.start_ns
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
    return {name: ns / 1e6 / n_steps for name, ns in ranked}


def activity_of(event) -> str:
    """A kineto event's activity name; torch builds without ``activity_type()`` (2.11) classify by device and
    name: GPU events are kernels (memcpy/memset apart), host events named cuda*/cu* runtime calls."""
    get = getattr(event, "activity_type", None)
    if get is not None:
        return str(get())
    name = event.name()
    if event.device_type() == torch.autograd.DeviceType.CUDA:  # GPU mirrors of host ranges: see step_profile
        return "gpu_memcpy" if name.startswith(("Memcpy", "Memset")) else "kernel"
    return "cuda_runtime" if name.startswith(("cuda", "cu")) else "cpu_op"


def profile_steps(step: Callable[[int], object], n_steps: int, device: torch.device) -> dict:
    """Run ``step(0)`` then ``step(1..n_steps)`` under torch.profiler; ``step_profile`` of the latter."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step(0)  # the profiler's own start-up (CUPTI buffers, first callbacks) lands here
        sync(device)
        with record_function(WINDOW):
            for i in range(1, n_steps + 1):
                step(i)
            sync(device)  # the window's end waits for its kernels
    events = [
        ProfEvent(
            e.name(),
            activity_of(e),
            e.start_thread_id(),
            e.start_ns(),
            e.end_ns(),
            int(getattr(e, "correlation_id", lambda: 0)() or 0),
        )
        for e in prof.profiler.kineto_results.events()
    ]
    return step_profile(events, n_steps, device.type == "cuda")


def host_profile(step: Callable[[int], object], n_steps: int, top: int = 15) -> dict[str, float]:
    """Run ``step(0..n_steps-1)`` under cProfile -> {"file:line(function)": self ms per step}, the ``top``
    costliest first (host time only: a function that waits for the device counts its wait)."""
    import cProfile
    import os
    import pstats

    if n_steps <= 0:
        return {}
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n_steps):
        step(i)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return {
        f"{os.path.basename(file)}:{line}({func})": self_s / n_steps * 1e3
        for (file, line, func), (_, _, self_s, _, _) in rows
    }


@dataclass(frozen=True)
class ThroughputOptions:
    """The command line of ``python -m hvd_ngp.bench throughput`` (``main``'s parser holds each option's help)."""

    scene: str
    config: str | None
    backends: str
    device: str
    precision: str
    target_samples: int
    warmup_steps: int
    steps: int
    profile_steps: int
    host_profile_steps: int
    eval_views: int
    points: int
    repeat: int
    no_compile: bool
    march_launches: bool
    grid_launches: bool
    inference_size: int
    inference_repeat: int
    inference_windows: str
    seed: int
    json: str
    markdown: str
    extra: list[str]  # trainer flags


def torch_profiler_steps(opts: ThroughputOptions) -> int:
    """Steps ``profile_steps`` runs: the profiled ones and the unmeasured first one (none when off)."""
    return opts.profile_steps + 1 if opts.profile_steps else 0


def trainer_settings(opts: ThroughputOptions, backend: str) -> Settings:
    """The trainer's settings for one backend's run: the bench's options, then the trainer flags after '--'."""
    profiled = torch_profiler_steps(opts) + opts.host_profile_steps
    argv = [
        "--scene",
        opts.scene,
        "--backend",
        backend,
        "--precision",
        opts.precision,
        "--device",
        opts.device,
        "--target_samples",
        str(opts.target_samples),
        "--n_steps",
        str(opts.warmup_steps + 2 * opts.steps + profiled),
        "--seed",
        str(opts.seed),
    ]
    if opts.config:
        argv = ["--config", opts.config, *argv]
    return parse_settings(argv + opts.extra, default_config=BASE_CONFIG if opts.device != "cpu" else CPU_CONFIG)


def gradient_bytes(field: torch.nn.Module) -> dict[str, int]:
    """Bytes of gradient per tensor group (the parameter name's first part: encoding, density_mlp, ...), what one
    allreduce per step moves; ``python -m hvd_ngp.bench fabric --from_json`` reads it."""
    groups: dict[str, int] = {}
    for name, p in field.named_parameters():
        if p.requires_grad:
            group = name.split(".")[0]
            groups[group] = groups.get(group, 0) + p.numel() * p.element_size()
    return groups


def bench_training(opts: ThroughputOptions, backend: str) -> dict:
    """End-to-end samples/s and the per-stage breakdown of one backend. The encoding's Triton-only kernel options
    (``-- --encoding '{"table_dtype": "float16"}'``) apply to the triton run; the others train without them."""
    s = trainer_settings(opts, backend)
    dev = dist.init(s.runtime.device).device
    blocks = model_for_backend(s.model.blocks, resolve_backend(backend, dev))  # auto: as Trainer.build resolves it
    s = replace(s, model=replace(s.model, blocks=blocks), flags={**s.flags, "model": blocks})
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    tr = Trainer.build(s)
    t0 = time.perf_counter()
    for step in range(opts.warmup_steps):
        tr.step(step)
    sync(dev)
    warm_s = time.perf_counter() - t0
    samples = torch.zeros((), device=dev, dtype=torch.float64)
    rays = 0
    t0 = time.perf_counter()
    for i in range(opts.steps):
        res, n_rays = tr.step(opts.warmup_steps + i)
        samples += torch.as_tensor(res.n_samples, device=dev, dtype=torch.float64)
        rays += n_rays
    sync(dev)
    seconds = time.perf_counter() - t0
    timer = StageTimer(dev)
    for i in range(opts.steps):
        tr.step(opts.warmup_steps + opts.steps + i, timer)
        timer.collect()
    first = opts.warmup_steps + 2 * opts.steps
    # F821 silenced on the two lambdas: ruff reads the `del tr` below as unbinding tr in them; they run before it
    launches = (
        profile_steps(lambda i: tr.step(first + i), opts.profile_steps, dev)  # noqa: F821
        if opts.profile_steps
        else {
            "profiled_steps": 0,
            "profiled_step_ms": None,
            "launches_per_step": None,
            "kernels_per_step": None,
            "gpu_busy_share": None,
            "aten_ops_per_step": None,
            "kernel_ms": {},
            "launch_sources": {},
            "kernel_timeline": [],
            "kernel_gaps": {},
        }
    )
    after = first + torch_profiler_steps(opts)
    host = host_profile(lambda i: tr.step(after + i), opts.host_profile_steps)  # noqa: F821
    sync(dev)
    marches = bench_march(tr) if dev.type == "cuda" and opts.march_launches else []
    grids = bench_grid(tr) if dev.type == "cuda" and opts.grid_launches else []
    ev = tr.evaluate(n_views=opts.eval_views) if opts.eval_views else {"psnr": float("nan")}
    inference = None
    if opts.inference_size and tr.backend in FAST_RENDERER_BACKENDS and tr.mp is None:
        from ..render.infer import InferenceWindows
        from .inference import bench_inference

        windows = [InferenceWindows.parse(w) for w in opts.inference_windows.split(",") if w.strip()]
        inference = bench_inference(tr, opts.inference_size, opts.inference_repeat, windows)
    result = {
        "backend": backend,
        "precision": tr.precision,  # resolved by Trainer.build (--precision auto)
        "samples_per_sec": float(samples) / seconds,
        "step_ms": seconds / opts.steps * 1e3,
        "samples_per_step": float(samples) / opts.steps,
        "rays_per_step": rays / opts.steps,
        "warmup_seconds": warm_s,
        "stages_ms": timer.mean_ms(),
        "test_psnr_after": ev["psnr"],
        "peak_memory_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
        **launches,
        "host_self_ms": host,
        "march_launches": marches,
        "grid_launches": grids,
        "gradient_bytes": gradient_bytes(tr.field),
        "inference": inference,
    }
    del tr
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return result


def bench_march(tr: Trainer, repeat: int = 50) -> list[dict]:
    """The march (count and write passes, positions written) of one batch at the trained state's ray count,
    under the launch training used (``marching.kernel_launch``, else ``LAUNCH``) and each other one of
    ``CANDIDATE_LAUNCHES``: ms per march and speed relative to the first. Every launch must write the same
    samples (checked: a RuntimeError otherwise). Empty without the fast renderer."""
    capacity = getattr(tr.renderer, "candidate_capacity", None)
    if capacity is None:
        return []
    from ..render.march_triton import CANDIDATE_LAUNCHES, LAUNCH, march_packed

    dev = tr.rt.device
    rays = tr.data.sample(tr.budget.n_rays)
    jitter = torch.rand(rays.origins.shape[0], device=dev, generator=torch.Generator(dev).manual_seed(0))
    used = tr.march.launch or LAUNCH

    def march(launch):
        return march_packed(
            rays.origins,
            rays.directions,
            tr.field.aabb,
            tr.grid,
            tr.march.schedule,
            jitter,
            capacity,
            positions=True,
            launch=launch,
        )

    ref = march(used)
    total = int(ref.total)
    rows: list[dict[str, Any]] = []
    for launch in dict.fromkeys((used, *CANDIDATE_LAUNCHES)):
        out = march(launch)
        if int(out.total) != total or not torch.equal(out.t[:total], ref.t[:total]):
            raise RuntimeError(f"march launch {launch} wrote other samples than {used} ({int(out.total)} vs {total})")
        rows.append(
            {
                "launch": f"block {launch.block}, segment {launch.segment}, {launch.warps} warps"
                + (" (trained with)" if launch == used else ""),
                "rays": rays.origins.shape[0],
                "samples": total,
                "ms": timed(lambda launch=launch: march(launch), dev, repeat),
            }
        )
    for row in rows:
        row["speed vs first"] = rows[0]["ms"] / row["ms"]
    return rows


def bench_grid(tr: Trainer, repeat: int = 50) -> list[dict]:
    """The hash grid's kernels on the points of one batch marched at the trained state's ray count, under each
    of ``hashgrid_triton.CANDIDATE_LAUNCHES`` (forward and backward alike): ms per forward over every marched
    point (the density pass) and per forward + backward over the first ``target_samples`` of them (the
    network pass). Every launch must give the same encoding and, to atomic order, the same table gradient
    (checked: a RuntimeError otherwise). Empty without the Triton hash grid and the fast renderer."""
    from ..model.encoding.hashgrid_triton import CANDIDATE_LAUNCHES, HashGridTriton
    from ..render.march_triton import march_packed

    enc, capacity = tr.field.encoding, getattr(tr.renderer, "candidate_capacity", None)
    if not isinstance(enc, HashGridTriton) or capacity is None:
        return []
    dev = tr.rt.device
    rays = tr.data.sample(tr.budget.n_rays)
    jitter = torch.rand(rays.origins.shape[0], device=dev, generator=torch.Generator(dev).manual_seed(0))
    packed = march_packed(
        rays.origins,
        rays.directions,
        tr.field.aabb,
        tr.grid,
        tr.march.schedule,
        jitter,
        capacity,
        positions=True,
        launch=tr.march.launch,
    )
    assert packed.x is not None  # positions=True: the march wrote each sample's point
    x = tr.field.normalize(packed.x[: int(packed.total)]).detach().contiguous()
    x_net = x[: min(x.shape[0], int(tr.step_settings.target_samples))]
    grad = torch.randn(x_net.shape[0], enc.n_output_dims, device=dev, generator=torch.Generator(dev).manual_seed(1))
    used = (enc.forward_launch, enc.backward_launch)

    def forward(points: Tensor) -> Tensor:
        with torch.no_grad():
            return enc(points)

    def forward_backward() -> Tensor:
        enc.params.grad = None
        enc(x_net).backward(grad)
        assert enc.params.grad is not None  # backward() has just filled it
        return enc.params.grad

    rows: list[dict[str, Any]] = []
    ref: tuple[Tensor, Tensor] | None = None
    try:
        for launch in dict.fromkeys((enc.backward_launch, *CANDIDATE_LAUNCHES)):
            enc.forward_launch = enc.backward_launch = launch
            out = (forward(x), forward_backward().clone())
            if ref is None:
                ref = out
            elif not torch.equal(out[0], ref[0]) or not torch.allclose(out[1], ref[1], rtol=1e-4, atol=1e-5):
                raise RuntimeError(f"hash grid launch {launch} computed other values than {rows[0]['launch']}")
            rows.append(
                {
                    "launch": f"block {launch.block}, {launch.warps} warps" + (" (trained with)" if not rows else ""),
                    "points": x.shape[0],
                    "forward ms": timed(lambda: forward(x), dev, repeat),
                    "network points": x_net.shape[0],
                    "fwd+bwd ms": timed(forward_backward, dev, repeat),
                }
            )
    finally:
        enc.forward_launch, enc.backward_launch = used
        enc.params.grad = None
    for row in rows:
        row["forward speed"] = rows[0]["forward ms"] / row["forward ms"]
        row["fwd+bwd speed"] = rows[0]["fwd+bwd ms"] / row["fwd+bwd ms"]
    return rows


def na(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def points_along_rays(n: int, dev: torch.device, per_ray: int = 128, step: float = 1 / 1024) -> Tensor:
    """``[n, 3]`` points in the unit cube, ``per_ray`` consecutive ones ``step`` apart along each random
    ray, as a training step's samples come (neighbours share cells, so the backward's atomics collide)."""
    gen = torch.Generator().manual_seed(0)
    rays = -(-n // per_ray)
    origins = torch.rand(rays, 1, 3, generator=gen) * 0.5 + 0.25
    dirs = torch.nn.functional.normalize(torch.randn(rays, 1, 3, generator=gen), dim=-1)
    t = torch.arange(per_ray, dtype=torch.float32)[None, :, None] * step
    return (origins + dirs * t).reshape(-1, 3)[:n].clamp(0.0, 1.0).to(dev)


def bench_hashgrid(opts: ThroughputOptions, spec: HashGridSpec, dev: torch.device) -> list[dict]:
    """Hash grid forward and forward+backward at ``opts.points`` points, per implementation: uniform
    random points, and points along rays (``points_along_rays``: the backward's case in training)."""
    x = torch.rand(opts.points, 3, device=dev)
    x_rays = points_along_rays(opts.points, dev)
    g = torch.randn(opts.points, spec.n_output_dims, device=dev)
    impls: list[tuple[str, torch.nn.Module]] = [("torch eager", HashGridTorch(spec).to(dev))]
    if dev.type == "cuda" and not opts.no_compile:
        # compiling a Module returns an OptimizedModule, a Module wrapping it (torch.compile types it a callable)
        impls.append(("torch.compile", cast(torch.nn.Module, torch.compile(HashGridTorch(spec).to(dev)))))
    if dev.type == "cpu":
        from ..model.encoding import hashgrid_cpp

        if hashgrid_cpp.available():
            impls.append(("C++ (cpu)", hashgrid_cpp.HashGridCpp(spec)))
    if triton_available(dev.type):
        from ..model.encoding.hashgrid_triton import HashGridTriton

        impls += [
            (f"triton fp32 table (runs merged at levels <= {MERGE_RUNS_BELOW})", HashGridTriton(spec).to(dev)),
            ("triton fp32 table, row-major output", HashGridTriton(spec, feature_major=False).to(dev)),
            ("triton fp32 table, runs not merged", HashGridTriton(spec, merge_runs_below=0).to(dev)),
            ("triton fp32 table, vector atomics", HashGridTriton(spec, vector_atomics=True).to(dev)),
            ("triton fp16 table", HashGridTriton(spec, torch.float16).to(dev)),
        ]
    if dev.type == "cuda" and tcnn_available():
        from ..model.encoding.tcnn import TcnnEncoding

        impls.append(("tiny-cuda-nn", TcnnEncoding(spec).to(dev)))
    rows: list[dict[str, Any]] = []
    for name, enc in impls:

        def fwd():
            with torch.no_grad():
                enc(x)

        def fwd_bwd(points: Tensor = x) -> None:
            enc.zero_grad(set_to_none=True)
            (enc(points) * g).sum().backward()

        rows.append(
            {
                "implementation": name,
                "fwd_ms": timed(fwd, dev, opts.repeat),
                "fwd_bwd_ms": timed(fwd_bwd, dev, opts.repeat),
                "fwd_bwd_ms_along_rays": timed(lambda: fwd_bwd(x_rays), dev, opts.repeat),
            }
        )
    ref = next((r["fwd_bwd_ms"] for r in rows if r["implementation"] == "torch.compile"), rows[0]["fwd_bwd_ms"])
    for r in rows:
        r["speedup_vs_compile" if len(impls) > 1 and dev.type == "cuda" else "speedup"] = ref / r["fwd_bwd_ms"]
    return rows


def bench_mlp(opts: ThroughputOptions, model: dict, dev: torch.device) -> list[dict]:
    """Density + colour MLPs forward+backward+Adam at ``opts.points`` samples (encoding excluded)."""
    from ..model.field import NGPField

    aabb = torch.tensor([[0.0] * 3, [1.0] * 3], device=dev)
    backends = (
        ["torch"]
        + (["triton"] if dev.type == "cuda" and triton_available(dev.type) else [])
        + (["tcnn"] if dev.type == "cuda" and tcnn_available() else [])
    )
    fused_model = {
        **model,
        "network": {**model["network"], "fused": True},
        "rgb_network": {**model["rgb_network"], "fused": True},
    }  # the fused MLPs are opt-in
    fields = {
        b: NGPField(fused_model if b == "triton" else model_for_backend(model, b), aabb, b).to(dev) for b in backends
    }
    n_in = fields["torch"].encoding.n_output_dims
    feats = torch.randn(opts.points, n_in, device=dev)
    dirs = torch.nn.functional.normalize(torch.randn(opts.points, 3, device=dev), dim=-1)
    opts_of = {
        b: torch.optim.Adam(f.mlp_parameters(), lr=1e-3, eps=1e-15, fused=dev.type == "cuda") for b, f in fields.items()
    }

    def network(field: NGPField):
        def net(f, d):
            h = field.density_mlp(f)
            return torch.sigmoid(field.rgb_mlp(field.dir_encoding.concat(d, h)).float()), h[:, 0]

        return net

    rows = []
    net = network(fields["torch"])
    variants = [("torch eager fp32", net, None, "torch"), ("torch eager fp16 autocast", net, torch.float16, "torch")]
    if dev.type == "cuda" and not opts.no_compile:
        variants.append(("torch.compile fp16 autocast", torch.compile(net), torch.float16, "torch"))
    if "triton" in fields:
        fused = network(fields["triton"])
        variants += [
            ("triton fused fp32", fused, None, "triton"),
            ("triton fused fp16 autocast", fused, torch.float16, "triton"),
        ]
    if "tcnn" in fields:
        variants.append(("tiny-cuda-nn", network(fields["tcnn"]), None, "tcnn"))
    for name, fn, dtype, backend in variants:
        opt = opts_of[backend]

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                rgb, s = fn(feats, dirs)
            (rgb.float().sum() + s.float().sum()).backward()
            opt.step()

        rows.append({"implementation": name, "fwd_bwd_adam_ms": timed(step, dev, opts.repeat)})
    return rows


def inference_tables(training: list[dict]) -> list[str]:
    """The inference rows of each backend that has them, and the single pass's stages (markdown blocks)."""
    out = []
    for r in training:
        inf = r.get("inference")
        if not inf:
            continue
        w, h = inf["size"]
        rows = [
            {
                "backend": r["backend"],
                **{k: ("" if v is None else f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()},
            }
            for row in inf["rows"]
        ]
        out += [
            f"Inference: one {w}x{h} view of the trained field ({inf['rays']} rays, {inf['repeat']} renders "
            f"per path, device synchronised), on black:",
            table(rows, list(rows[0])),
        ]
        if inf["stages_ms"]:
            stages = [{"stage (ms/view)": k, r["backend"]: f"{v:.3f}"} for k, v in inf["stages_ms"].items()]
            out += [
                f"Single-pass stages ({inf['stage_windows']}; CUDA events, one render):",
                table(stages, ["stage (ms/view)", r["backend"]]),
            ]
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.bench throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scene", default="builtin")
    p.add_argument("--config", default=None, help="trainer config (default: base.json on GPU, cpu.json on CPU)")
    p.add_argument("--backends", default="all", help="comma-separated backends, or 'all' available here")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "fp16", "bf16"),
        default="auto",
        help="the trainer's --precision (auto: bf16 for triton on a GPU, fp32 otherwise)",
    )
    p.add_argument("--target_samples", type=int, default=1 << 18)
    p.add_argument("--warmup_steps", type=int, default=500)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument(
        "--profile_steps",
        type=int,
        default=3,
        help="steps under torch.profiler for launches/step and GPU busy (0: skip)",
    )
    p.add_argument(
        "--host_profile_steps",
        type=int,
        default=0,
        help="steps under cProfile for the host's costliest functions (0: skip)",
    )
    p.add_argument("--eval_views", type=int, default=0, help="test views for a PSNR sanity check after training")
    p.add_argument("--points", type=int, default=1 << 18, help="points for the micro-benchmarks")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--no_compile", action="store_true", help="skip the torch.compile references")
    p.add_argument(
        "--march_launches",
        action="store_true",
        help="after training, time the march kernel's candidate launches on one batch (GPU, fast renderer)",
    )
    p.add_argument(
        "--grid_launches",
        action="store_true",
        help="after training, time the hash grid kernels' candidate launches on one batch's points (GPU)",
    )
    p.add_argument(
        "--inference_size",
        type=int,
        default=800,
        help="after training, one view at this longer side by both inference paths (Triton backends; 0: skip)",
    )
    p.add_argument("--inference_repeat", type=int, default=3, help="timed renders per inference path")
    p.add_argument(
        "--inference_windows",
        default="8:128",
        help="comma-separated FIRST:MOST candidate windows of the single-pass path, each a row "
        "(the first also gives the stage breakdown)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="runs/bench/throughput.json")
    p.add_argument("--markdown", default="", help="also append a dated Markdown section to this file (default: none)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after '--': more trainer flags")
    opts = options_from(ThroughputOptions, p.parse_args(argv))
    opts = replace(opts, extra=[a for a in opts.extra if a != "--"])
    for name in ("profile_steps", "host_profile_steps", "inference_size"):
        if getattr(opts, name) < 0:
            p.error(f"--{name} must be >= 0, got {getattr(opts, name)}")
    if opts.inference_repeat < 1:
        p.error(f"--inference_repeat must be >= 1, got {opts.inference_repeat}")
    from ..render.infer import InferenceWindows

    try:
        for w in opts.inference_windows.split(","):
            InferenceWindows.parse(w)
    except ValueError as exc:
        p.error(f"--inference_windows: {exc}")
    dev = dist.init(opts.device).device
    if opts.backends == "all":
        fast = triton_available(dev.type) and dev.type == "cuda"
        backends = (
            ["torch"]
            + (["cpp"] if dev.type == "cpu" else [])
            + (["triton"] if fast else [])
            + (["tcnn"] if fast and tcnn_available() else [])
        )
    else:
        backends = [b.strip() for b in opts.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        p.error(f"unknown backend(s) {unknown} (known: {', '.join(BACKENDS)})")

    training = [bench_training(opts, b) for b in backends]
    ref = next((r["samples_per_sec"] for r in training if r["backend"] == "torch"), None)
    for r in training:
        r["vs_torch"] = r["samples_per_sec"] / ref if ref else None
    model = trainer_settings(opts, "torch").model.blocks
    spec = HashGridSpec.from_config(model["encoding"])
    grid_rows = bench_hashgrid(opts, spec, dev)
    mlp_rows = bench_mlp(opts, model, dev)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    stages = sorted({k for r in training for k in r["stages_ms"]})

    rows = [
        {
            "backend": r["backend"],
            "precision": r["precision"],
            "M samples/s": f"{r['samples_per_sec'] / 1e6:.2f}",
            "vs torch": f"{r['vs_torch']:.2f}x" if r["vs_torch"] else "",
            "step ms": f"{r['step_ms']:.2f}",
            "samples/step": f"{r['samples_per_step']:.0f}",
            "rays/step": f"{r['rays_per_step']:.0f}",
            "peak GiB": f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "n/a",
            "launches/step": na(r["launches_per_step"], "{:.0f}"),
            "GPU busy": na(r["gpu_busy_share"], "{:.0%}"),
            "aten ops/step": na(r["aten_ops_per_step"], "{:.0f}"),
        }
        for r in training
    ]
    stage_rows = [
        {"stage (ms/step)": s, **{r["backend"]: f"{r['stages_ms'].get(s, 0.0):.3f}" for r in training}} for s in stages
    ]
    grid_table = [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in grid_rows]
    mlp_table = [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in mlp_rows]
    kernels = [
        {"kernel (device ms/step)": name[:70], r["backend"]: f"{ms:.3f}"}
        for r in training
        for name, ms in r["kernel_ms"].items()
    ]
    sources = [
        {"launch source": name[:70], r["backend"]: f"{n:.1f}"}
        for r in training
        for name, n in r["launch_sources"].items()
    ]
    host = [
        {"host function (self ms/step)": name[:70], r["backend"]: f"{ms:.3f}"}
        for r in training
        for name, ms in r["host_self_ms"].items()
    ]
    marches = [
        {"backend": r["backend"], **{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in m.items()}}
        for r in training
        for m in r["march_launches"]
    ]
    grid_rows_launch = [
        {"backend": r["backend"], **{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in m.items()}}
        for r in training
        for m in r["grid_launches"]
    ]
    text = "\n\n".join(
        [
            f"Device: {device}; scene {opts.scene}; {opts.target_samples} samples/step target; precision {opts.precision}; "
            f"{opts.warmup_steps} warm-up steps, {opts.steps} timed steps.",
            table(rows, list(rows[0])),
            f"launches/step: CUDA kernel and graph launch calls per step; GPU busy: union of the kernels' device time "
            f"/ wall time; aten ops/step: outermost aten operators (the CPU's stand-in for launches); over "
            f"{opts.profile_steps} steps under torch.profiler (its overhead makes GPU busy a lower bound).",
            table(stage_rows, ["stage (ms/step)", *[r["backend"] for r in training]]),
            *(
                [
                    f"Between the kernels ({r['backend']}, per step): idle {r['kernel_gaps']['idle_ms_per_step']:.3f} ms; "
                    f"{r['kernel_gaps']['short_kernels_per_step']:.0f} kernels under {SHORT_KERNEL_US:.0f} us take "
                    f"{r['kernel_gaps']['short_kernel_ms_per_step']:.3f} ms; idle gaps over 20 us (us before the kernel): "
                    f"{ {k: round(v, 1) for k, v in r['kernel_gaps']['idle_us_before_per_step'].items()} }"
                    for r in training
                    if r["kernel_gaps"]
                ]
            ),
            *(
                [
                    "Longest kernels under the profiler (device time per step):",
                    table(kernels, ["kernel (device ms/step)", *[r["backend"] for r in training]]),
                ]
                if kernels
                else []
            ),
            *(
                [
                    "Host-side launches per step by source (the outermost host operator around each launch call):",
                    table(sources, ["launch source", *[r["backend"] for r in training]]),
                ]
                if sources
                else []
            ),
            *(
                [
                    f"The host's costliest functions over {opts.host_profile_steps} steps under cProfile (self time per step):",
                    table(host, ["host function (self ms/step)", *[r["backend"] for r in training]]),
                ]
                if host
                else []
            ),
            *inference_tables(training),
            *(
                [
                    "The march (count and write passes) of one batch after training, per launch (same samples each):",
                    table(marches, list(marches[0])),
                ]
                if marches
                else []
            ),
            *(
                [
                    "The hash grid's kernels on one batch's marched points after training, per launch (same values each):",
                    table(grid_rows_launch, list(grid_rows_launch[0])),
                ]
                if grid_rows_launch
                else []
            ),
            f"Hash grid ({spec.n_levels} levels x {spec.n_features_per_level}, 2^{spec.log2_hashmap_size} table), "
            f"{opts.points} points:",
            table(grid_table, list(grid_table[0])),
            f"Density + colour MLPs, {opts.points} samples:",
            table(mlp_table, list(mlp_table[0])),
        ]
    )
    print(text)
    result = {
        "device": device,
        "options": asdict(opts),
        "training": training,
        "hashgrid": grid_rows,
        "mlp": mlp_rows,
    }
    if opts.json:
        write_json(opts.json, result)
    if opts.markdown:
        append_markdown(opts.markdown, "Training throughput", text, ["throughput", *(argv if argv is not None else [])])
    return result
