"""``python -m hvd_ngp.bench memory``: evaluation under GPU memory budgets, side by side in one run.

Trains one model (``--n_steps``), then evaluates the test views under each budget of ``--budgets``
(GiB; 0: the default budget, uncapped): views/s, PSNR, the render plan, and the process's peak
allocated and reserved memory during the evaluation. The PSNRs must agree (the plan changes the
chunks, not the pixels) and the peaks stay under each cap.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass

import torch

from ..cluster import dist
from ..config import BASE_CONFIG, CPU_CONFIG, parse_settings
from ..observe.memory import GIB, MemoryBudget, MemoryMeter, ranks_on_device
from ..options import options_from
from ..training.trainer import Trainer
from .report import append_markdown, table, write_json


def evaluate_under(tr: Trainer, gb: float, n_views: int) -> dict:
    """Evaluate ``tr``'s model under a budget of ``gb`` GiB (0: the default) and measure it."""
    rt = tr.rt
    if rt.device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, rt.device)  # undo the previous cap
        torch.cuda.synchronize(rt.device)
    tr.memory = MemoryBudget.for_device(
        rt.device,
        gb,
        ranks_on_device(rt.local_rank, rt.local_size, torch.cuda.device_count() if rt.device.type == "cuda" else 0),
    )
    tr.meter = MemoryMeter(rt.device)
    t0 = time.perf_counter()
    ev = tr.evaluate(n_views=n_views)
    seconds = time.perf_counter() - t0
    peak = tr.meter.peaks.get("eval")
    return {
        "budget_gb": gb,
        "budget_gib": None if tr.memory.bytes is None else tr.memory.bytes / GIB,
        "budget_source": tr.memory.source,
        "views": ev["views"],
        "seconds": seconds,
        "views_per_s": ev["views"] / seconds,
        "psnr": ev["psnr"],
        "peak_allocated_gib": peak.allocated / GIB if peak else None,
        "peak_reserved_gib": peak.reserved / GIB if peak else None,
    }


@dataclass(frozen=True)
class MemoryOptions:
    """The command line of ``python -m hvd_ngp.bench memory`` (``main``'s parser holds each option's help)."""

    scene: str
    device: str
    n_steps: int
    budgets: str
    eval_views: int
    json: str
    markdown: str
    extra: list[str]  # trainer flags


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.bench memory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--scene", default="builtin")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n_steps", type=int, default=2000, help="training steps before the evaluations")
    p.add_argument("--budgets", default="0,16,8", help="comma-separated GiB (0: the default budget, uncapped)")
    p.add_argument("--eval_views", type=int, default=0, help="test views per evaluation (0: all)")
    p.add_argument("--json", default="runs/bench/memory.json")
    p.add_argument("--markdown", default="", help="also append a dated Markdown section to this file (default: none)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after '--': more trainer flags")
    opts = options_from(MemoryOptions, p.parse_args(argv))
    extra = [a for a in opts.extra if a != "--"]
    settings = parse_settings(
        ["--scene", opts.scene, "--device", opts.device, "--n_steps", str(opts.n_steps), *extra],
        default_config=BASE_CONFIG if opts.device != "cpu" else CPU_CONFIG,
    )
    dist.init(settings.runtime.device)
    tr = Trainer.build(settings)
    t0 = time.perf_counter()
    for step in range(opts.n_steps):
        tr.step(step)
    if tr.rt.device.type == "cuda":
        torch.cuda.synchronize(tr.rt.device)
    train_s = time.perf_counter() - t0
    evaluate_under(tr, 0.0, 1)  # compiles the rendering kernels: the first timed budget does not pay for it
    runs = [evaluate_under(tr, float(gb), opts.eval_views) for gb in opts.budgets.split(",") if gb.strip()]
    reference = runs[0]
    rows = [
        {
            "budget": r["budget_source"],
            "views": r["views"],
            "views/s": f"{r['views_per_s']:.2f}",
            "vs first": f"{r['views_per_s'] / reference['views_per_s']:.2f}x",
            "PSNR": f"{r['psnr']:.4f}",
            "peak alloc GiB": "n/a" if r["peak_allocated_gib"] is None else f"{r['peak_allocated_gib']:.2f}",
            "peak reserved GiB": "n/a" if r["peak_reserved_gib"] is None else f"{r['peak_reserved_gib']:.2f}",
        }
        for r in runs
    ]
    device = torch.cuda.get_device_name(tr.rt.device) if tr.rt.device.type == "cuda" else "cpu"
    text = "\n\n".join(
        [
            f"Device: {device}; scene {opts.scene}; {opts.n_steps} training steps ({train_s:.1f} s), then "
            f"the same model evaluated under each budget.",
            table(rows, list(rows[0])),
        ]
    )
    print(text)
    result = {"device": device, "options": asdict(opts), "train_seconds": train_s, "runs": runs}
    if opts.json:
        write_json(opts.json, result)
    if opts.markdown:
        append_markdown(opts.markdown, "Evaluation under memory budgets", text, ["memory", *(argv or [])])
    return result
