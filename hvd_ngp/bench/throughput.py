"""``python -m hvd_ngp.bench throughput``: training throughput per backend, side by side in one run.

For each backend (torch reference, Triton kernels, ...): train ``--warmup_steps`` steps so the
occupancy grid and the ray budget settle, then time ``--steps`` steps end to end (no per-step
synchronisation) and again with a per-stage breakdown (CUDA events; synchronises once per step).
Micro-benchmarks at ``--points`` points: the hash grid forward and forward+backward (torch eager,
torch.compile, Triton fp32 and fp16 tables, tiny-cuda-nn when installed) and the two MLPs
forward+backward+Adam (torch, torch.compile, the fused Triton MLPs, tiny-cuda-nn; ``python -m
hvd_ngp.bench mlp`` times the MLPs alone, per precision). Reports samples/s
(samples through the network with gradients), ratios to the torch reference, peak GPU memory.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

from ..cluster import dist
from ..config import BASE_CONFIG, CPU_CONFIG, parse_args
from ..model.encoding import BACKENDS
from ..model.encoding.hashgrid import HashGridSpec, HashGridTorch
from ..model.encoding.tcnn import tcnn_available
from ..triton_support import triton_available
from ..observe.profiling import StageTimer
from ..training.trainer import Trainer
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


def trainer_args(opts: argparse.Namespace, backend: str) -> argparse.Namespace:
    argv = ["--scene", opts.scene, "--backend", backend, "--precision", opts.precision, "--device", opts.device,
            "--target_samples", str(opts.target_samples), "--n_steps", str(opts.warmup_steps + 2 * opts.steps),
            "--seed", str(opts.seed)]
    if opts.config:
        argv = ["--config", opts.config, *argv]
    return parse_args(argv + opts.extra, default_config=BASE_CONFIG if opts.device != "cpu" else CPU_CONFIG)


def bench_training(opts: argparse.Namespace, backend: str) -> dict:
    """End-to-end samples/s and the per-stage breakdown of one backend."""
    args = trainer_args(opts, backend)
    dev = dist.init(args.device).device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    tr = Trainer.build(args)
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
    ev = tr.evaluate(n_views=opts.eval_views) if opts.eval_views else {"psnr": float("nan")}
    result = {
        "backend": backend, "samples_per_sec": float(samples) / seconds, "step_ms": seconds / opts.steps * 1e3,
        "samples_per_step": float(samples) / opts.steps, "rays_per_step": rays / opts.steps,
        "warmup_seconds": warm_s, "stages_ms": timer.mean_ms(), "test_psnr_after": ev["psnr"],
        "peak_memory_gib": torch.cuda.max_memory_allocated(dev) / 2 ** 30 if dev.type == "cuda" else None,
    }
    del tr
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return result


def bench_hashgrid(opts: argparse.Namespace, spec: HashGridSpec, dev: torch.device) -> list[dict]:
    """Hash grid forward and forward+backward at ``opts.points`` points, per implementation."""
    x = torch.rand(opts.points, 3, device=dev)
    g = torch.randn(opts.points, spec.n_output_dims, device=dev)
    impls: list[tuple[str, torch.nn.Module]] = [("torch eager", HashGridTorch(spec).to(dev))]
    if dev.type == "cuda" and not opts.no_compile:
        impls.append(("torch.compile", torch.compile(HashGridTorch(spec).to(dev))))
    if dev.type == "cpu":
        from ..model.encoding import hashgrid_cpp

        if hashgrid_cpp.available():
            impls.append(("C++ (cpu)", hashgrid_cpp.HashGridCpp(spec)))
    if triton_available(dev.type):
        from ..model.encoding.hashgrid_triton import HashGridTriton

        impls += [("triton fp32 table", HashGridTriton(spec).to(dev)),
                  ("triton fp16 table", HashGridTriton(spec, torch.float16).to(dev))]
    if dev.type == "cuda" and tcnn_available():
        from ..model.encoding.tcnn import TcnnEncoding

        impls.append(("tiny-cuda-nn", TcnnEncoding(spec).to(dev)))
    rows = []
    for name, enc in impls:
        def fwd():
            with torch.no_grad():
                enc(x)

        def fwd_bwd():
            enc.zero_grad(set_to_none=True)
            (enc(x) * g).sum().backward()

        rows.append({"implementation": name, "fwd_ms": timed(fwd, dev, opts.repeat),
                     "fwd_bwd_ms": timed(fwd_bwd, dev, opts.repeat)})
    ref = next((r["fwd_bwd_ms"] for r in rows if r["implementation"] == "torch.compile"), rows[0]["fwd_bwd_ms"])
    for r in rows:
        r["speedup_vs_compile" if len(impls) > 1 and dev.type == "cuda" else "speedup"] = ref / r["fwd_bwd_ms"]
    return rows


def bench_mlp(opts: argparse.Namespace, model: dict, dev: torch.device) -> list[dict]:
    """Density + colour MLPs forward+backward+Adam at ``opts.points`` samples (encoding excluded)."""
    from ..model.field import NGPField

    aabb = torch.tensor([[0.0] * 3, [1.0] * 3], device=dev)
    backends = ["torch"] + (["triton"] if dev.type == "cuda" and triton_available(dev.type) else []) + \
        (["tcnn"] if dev.type == "cuda" and tcnn_available() else [])
    fields = {b: NGPField(model, aabb, b).to(dev) for b in backends}
    n_in = fields["torch"].encoding.n_output_dims
    feats = torch.randn(opts.points, n_in, device=dev)
    dirs = torch.nn.functional.normalize(torch.randn(opts.points, 3, device=dev), dim=-1)
    opts_of = {b: torch.optim.Adam(f.mlp_parameters(), lr=1e-3, eps=1e-15, fused=dev.type == "cuda")
               for b, f in fields.items()}

    def network(field: NGPField):
        def net(f, d):
            h = field.density_mlp(f)
            return torch.sigmoid(field.rgb_mlp(torch.cat([field.dir_encoding(d).to(h.dtype), h], -1)).float()), h[:, 0]
        return net

    rows = []
    net = network(fields["torch"])
    variants = [("torch eager fp32", net, None, "torch"), ("torch eager fp16 autocast", net, torch.float16, "torch")]
    if dev.type == "cuda" and not opts.no_compile:
        variants.append(("torch.compile fp16 autocast", torch.compile(net), torch.float16, "torch"))
    if "triton" in fields:
        fused = network(fields["triton"])
        variants += [("triton fused fp32", fused, None, "triton"),
                     ("triton fused fp16 autocast", fused, torch.float16, "triton")]
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


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.bench throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scene", default="builtin")
    p.add_argument("--config", default=None, help="trainer config (default: base.json on GPU, cpu.json on CPU)")
    p.add_argument("--backends", default="all", help="comma-separated backends, or 'all' available here")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    p.add_argument("--target_samples", type=int, default=1 << 18)
    p.add_argument("--warmup_steps", type=int, default=500)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--eval_views", type=int, default=0, help="test views for a PSNR sanity check after training")
    p.add_argument("--points", type=int, default=1 << 18, help="points for the micro-benchmarks")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--no_compile", action="store_true", help="skip the torch.compile references")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="runs/bench/throughput.json")
    p.add_argument("--markdown", default="docs/BENCHMARKS.md", help="append a dated section here ('' to skip)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after '--': more trainer flags")
    opts = p.parse_args(argv)
    opts.extra = [a for a in opts.extra if a != "--"]
    dev = dist.init(opts.device).device
    if opts.backends == "all":
        fast = triton_available(dev.type) and dev.type == "cuda"
        backends = ["torch"] + (["cpp"] if dev.type == "cpu" else []) + (["triton"] if fast else []) + \
            (["tcnn"] if fast and tcnn_available() else [])
    else:
        backends = [b.strip() for b in opts.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        p.error(f"unknown backend(s) {unknown} (known: {', '.join(BACKENDS)})")

    training = [bench_training(opts, b) for b in backends]
    ref = next((r["samples_per_sec"] for r in training if r["backend"] == "torch"), None)
    for r in training:
        r["vs_torch"] = r["samples_per_sec"] / ref if ref else None
    model = trainer_args(opts, "torch").model
    spec = HashGridSpec.from_config({k: v for k, v in model["encoding"].items() if k != "table_dtype"})
    grid_rows = bench_hashgrid(opts, spec, dev)
    mlp_rows = bench_mlp(opts, model, dev)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    stages = sorted({k for r in training for k in r["stages_ms"]})

    rows = [{"backend": r["backend"], "M samples/s": f"{r['samples_per_sec'] / 1e6:.2f}",
             "vs torch": f"{r['vs_torch']:.2f}x" if r["vs_torch"] else "", "step ms": f"{r['step_ms']:.2f}",
             "samples/step": f"{r['samples_per_step']:.0f}", "rays/step": f"{r['rays_per_step']:.0f}",
             "peak GiB": f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "n/a"} for r in training]
    stage_rows = [{"stage (ms/step)": s, **{r["backend"]: f"{r['stages_ms'].get(s, 0.0):.3f}" for r in training}}
                  for s in stages]
    grid_table = [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in grid_rows]
    mlp_table = [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in mlp_rows]
    text = "\n\n".join([
        f"Device: {device}; scene {opts.scene}; {opts.target_samples} samples/step target; precision {opts.precision}; "
        f"{opts.warmup_steps} warm-up steps, {opts.steps} timed steps.",
        table(rows, list(rows[0])),
        table(stage_rows, ["stage (ms/step)", *[r["backend"] for r in training]]),
        f"Hash grid ({spec.n_levels} levels x {spec.n_features_per_level}, 2^{spec.log2_hashmap_size} table), "
        f"{opts.points} points:",
        table(grid_table, list(grid_table[0])),
        f"Density + colour MLPs, {opts.points} samples:",
        table(mlp_table, list(mlp_table[0])),
    ])
    print(text)
    result = {"device": device, "options": {k: v for k, v in vars(opts).items()}, "training": training,
              "hashgrid": grid_rows, "mlp": mlp_rows}
    if opts.json:
        write_json(opts.json, result)
    if opts.markdown:
        append_markdown(opts.markdown, "Training throughput", text, ["throughput", *(argv if argv is not None else [])])
    return result
