"""``python -m hvd_ngp.bench scaling``: how training scales with the number of ranks.

    python -m hvd_ngp.bench scaling --ranks 1,2 -- --scene data/nerf_synthetic/lego --n_steps 20000

For each rank count: one launch (through ``hvd_ngp.tools.launch``, so hostfiles and fabrics work as for
training) of the same training run. ``--mode weak`` (the default): ``--target_samples`` per rank and
step, speedup = throughput against the smallest count's per-rank throughput. ``--mode strong``:
``--target_samples`` for all ranks together, each of N ranks training target_samples / N per step,
speedup = seconds per step at the smallest count (x its ranks) / seconds per step at N. ``both``
runs each (the one-rank run serves both). Efficiency = speedup / N. Reports throughput and seconds
per step (steady state: log intervals after the first), speedup and efficiency, GPU utilization and
samples per joule (NVML; n/a on CPU), the share of training
time spent waiting for gradient allreduces, the training time (evaluation excluded) until test PSNR
first reached each target (evaluated every ``--eval_every`` steps or at ``--eval_at_s`` times; by
default ten times per run; "not reached" otherwise), and
Horovod's allreduce of the same gradient sizes against raw ``torch.distributed`` (gloo on CPU, nccl
on GPU) measured in the same processes. Prints a table, writes JSON, and (``--markdown FILE``) appends a
dated section with the command to FILE.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..cluster.comm import describe_allreduce
from ..config import BASE_CONFIG, CPU_CONFIG, parse_settings
from ..errors import HvdNgpError
from ..options import options_from
from ..tools.launch import parse_options as launch_options, plan, split_program_args
from .report import append_markdown, table, write_json

WORKER = "hvd_ngp.bench._scaling_rank"
MODES = ("weak", "strong", "both")


class BenchError(HvdNgpError):
    """A benchmark run failed."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.bench scaling",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--ranks",
        default="auto",
        help="comma-separated rank counts (auto: 1, 2, 4, ... up to the GPUs or the hostfile's slots; 1,2 on CPU)",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="weak",
        help="weak: --target_samples per rank and step; strong: --target_samples per step for all ranks "
        "together (each of N ranks trains target_samples / N); both: each",
    )
    p.add_argument("--psnr_targets", default="33,35", help="test PSNR targets (dB) for time-to-PSNR")
    p.add_argument("--ceiling_repeats", type=int, default=20, help="timed allreduces per tensor for the ceiling")
    p.add_argument("--out_dir", default=None, help="per-run results and logs (default runs/bench/scaling-<time>)")
    p.add_argument("--json", default=None, help="summary JSON (default <out_dir>/scaling.json)")
    p.add_argument(
        "--markdown", default="", help="also append a dated Markdown section to this file (default, '' or 'none': no)"
    )
    p.add_argument("--timeout_s", type=float, default=0, help="give up on one rank count after this long (0: never)")
    p.add_argument(
        "--note", default="", help="a sentence added to the Markdown section (e.g. what else ran on the machine)"
    )
    g = p.add_argument_group("launch (as hvd-ngp-launch)")
    g.add_argument("--hostfile")
    g.add_argument("-H", "--hosts")
    g.add_argument("--launcher", choices=("horovodrun", "mpirun"), default="horovodrun")
    g.add_argument("--controller", choices=("auto", "mpi", "gloo"), default="auto")
    g.add_argument("--fabric", choices=("auto", "ib", "eth"), default="auto")
    g.add_argument("--iface")
    return p


def rank_counts(spec: str, hosts_slots: int | None) -> list[int]:
    if spec != "auto":
        try:
            counts = sorted({int(x) for x in spec.split(",")})
        except ValueError:
            raise BenchError(f"--ranks expects comma-separated integers, got {spec!r}") from None
        if not counts or counts[0] < 1:
            raise BenchError(f"--ranks must be positive, got {spec!r}")
        return counts
    limit = hosts_slots or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    counts, n = [], 1
    while n <= limit:
        counts.append(n)
        n *= 2
    return counts


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds at the first evaluation with test PSNR >= target."""
    return next((t for t, psnr in curve if psnr >= target), None)


def per_rank_samples(mode: str, target_samples: int, ranks: int) -> int:
    """Samples per rank and step for one run: ``target_samples`` (weak) or its share of ``ranks`` (strong)."""
    if mode == "weak":
        return target_samples
    if target_samples % ranks:
        raise BenchError(
            f"--mode strong splits --target_samples {target_samples} over the ranks, but {ranks} "
            f"rank(s) do not divide it; choose a multiple of {ranks}"
        )
    return target_samples // ranks


def summarize(results: list[dict], targets: list[float]) -> list[dict]:
    """Per run (each result carries its ``mode``): throughput, seconds per step, speedup and efficiency against
    the smallest rank count of the same mode (weak: per-rank throughput; strong: seconds per step), time-to-PSNR."""
    rows = []
    for r in results:
        mode = r.get("mode", "weak")
        base = next(b for b in results if b.get("mode", "weak") == mode)
        if mode == "strong":
            step_s, base_s = r.get("steady_step_s"), base.get("steady_step_s")
            speedup = base["ranks"] * base_s / step_s if step_s and base_s else None
        else:
            base_rate = base["steady_samples_per_sec"] / base["ranks"]  # per rank
            speedup = r["steady_samples_per_sec"] / base_rate if base_rate > 0 else None
        ceiling = next((c for c in r["ceiling"] if c["tensor"].startswith("hash grid")), None)
        rows.append(
            {
                "mode": mode,
                "ranks": r["ranks"],
                "nodes": r["nodes"],
                "samples_per_rank_step": r.get("target_samples"),
                "step_s": r.get("steady_step_s"),
                "samples_per_sec": r["steady_samples_per_sec"],
                "speedup": speedup,
                "efficiency": None if speedup is None else speedup / r["ranks"],
                "gpu_util_percent": r["gpu_util_percent"],
                "comm_share": r["comm_share"],
                "samples_per_joule": r["samples_per_joule"],
                "test_psnr": r["test_psnr"],
                "time_to_psnr": {str(t): time_to(r["psnr_curve"], t) for t in targets},
                "hash_grid_allreduce_vs_raw": None if ceiling is None else ceiling["ratio"],
            }
        )
    return rows


def fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def render(rows: list[dict], results: list[dict], targets: list[float]) -> str:
    """The scaling table, the allreduce-ceiling table and the update table (plain text that is also Markdown)."""

    def reached(row: dict, t: float) -> str:
        s = row["time_to_psnr"][str(t)]
        return "not reached" if s is None else f"{s:.1f} s"

    columns = [
        "mode",
        "ranks",
        "nodes",
        "samples/rank/step",
        "ms/step",
        "M samples/s",
        "speedup",
        "efficiency",
        "GPU util",
        "comm share",
        "samples/J",
        *(f"time to {t:g} dB" for t in targets),
        "final test PSNR",
    ]
    cells = [
        dict(
            zip(
                columns,
                [
                    r["mode"],
                    r["ranks"],
                    r["nodes"],
                    fmt(r["samples_per_rank_step"], "d"),
                    fmt(None if r["step_s"] is None else 1e3 * r["step_s"], ".1f"),
                    fmt(r["samples_per_sec"] / 1e6, ".3f"),
                    fmt(r["speedup"], ".2f", "x"),
                    fmt(None if r["efficiency"] is None else 100 * r["efficiency"], ".1f", "%"),
                    fmt(r["gpu_util_percent"], ".0f", "%"),
                    fmt(None if r["comm_share"] is None else 100 * r["comm_share"], ".1f", "%"),
                    fmt(r["samples_per_joule"], ".3g"),
                    *(reached(r, t) for t in targets),
                    fmt(r["test_psnr"], ".2f", " dB"),
                ],
            )
        )
        for r in rows
    ]
    out = table(cells, columns)
    c_columns = ["mode", "ranks", "tensor", "MiB", "Horovod", "raw torch.distributed", "Horovod / raw"]
    c_cells = [
        dict(
            zip(
                c_columns,
                [
                    r.get("mode", "weak"),
                    r["ranks"],
                    c["tensor"],
                    f"{c['bytes'] / 2**20:.1f}",
                    f"{1e3 * c['horovod_s']:.2f} ms, {c['horovod_busbw_gbs']:.3g} GB/s ({r['controller']} controller)",
                    f"{1e3 * c['raw_s']:.2f} ms, {c['raw_busbw_gbs']:.3g} GB/s ({c['backend']})",
                    f"{100 * c['ratio']:.0f}%",
                ],
            )
        )
        for r in results
        for c in r["ceiling"]
    ]
    if c_cells:
        out += "\n\nAllreduce of the same gradient sizes, same processes (median; bus bandwidth):\n\n"
        out += table(c_cells, c_columns)
    u_columns = [
        "mode",
        "ranks",
        "MiB",
        "allreduce + Adam on all",
        "reduce-scatter + Adam on 1/n + all-gather",
        "sharded speedup",
        "largest difference",
    ]
    u_cells = [
        dict(
            zip(
                u_columns,
                [
                    r.get("mode", "weak"),
                    r["ranks"],
                    f"{u['bytes'] / 2**20:.1f}",
                    f"{1e3 * u['allreduce_update_s']:.2f} ms",
                    f"{1e3 * u['sharded_update_s']:.2f} ms",
                    f"{u['speedup']:.2f}x",
                    f"{u['max_difference']:.1e}",
                ],
            )
        )
        for r in results
        if (u := r.get("update"))
    ]
    if u_cells:
        out += "\n\nOne Adam update of every parameter, allreduced or sharded, same processes (median):\n\n"
        out += table(u_cells, u_columns)
    return out


@dataclass(frozen=True)
class ScalingOptions:
    """``python -m hvd_ngp.bench scaling``'s own options (``build_parser`` holds their help); the trainer's flags
    follow '--' and stay a list."""

    ranks: str
    mode: str
    psnr_targets: str
    ceiling_repeats: int
    out_dir: str | None
    json: str | None
    markdown: str
    timeout_s: float
    note: str
    hostfile: str | None
    hosts: str | None
    launcher: str
    controller: str
    fabric: str
    iface: str | None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    own, trainer_args = split_program_args(argv)
    opts = options_from(ScalingOptions, build_parser().parse_args(own))
    targets = [float(t) for t in opts.psnr_targets.split(",") if t]
    trainer = parse_settings(trainer_args, default_config=BASE_CONFIG if torch.cuda.is_available() else CPU_CONFIG)
    extra = (
        []
        if trainer.eval.eval_every or trainer.eval.eval_at_s
        else ["--eval_every", str(max(trainer.loop.n_steps // 10, 1))]
    )
    extra += [] if trainer.eval.n_eval_views else ["--n_eval_views", "8"]
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(opts.out_dir or f"runs/bench/scaling-{stamp}")
    launch_opts = [
        a
        for flag, v in (("--hostfile", opts.hostfile), ("-H", opts.hosts), ("--iface", opts.iface))
        if v
        for a in (flag, v)
    ]
    launch_opts += [
        "--launcher",
        opts.launcher,
        "--controller",
        opts.controller,
        "--fabric",
        opts.fabric,
        "--module",
        WORKER,
    ]
    slots = None
    if opts.hostfile or opts.hosts:
        slots = plan(launch_options(launch_opts), os.environ, [], trainer.runtime.comm).placement.np
    modes = ["weak", "strong"] if opts.mode == "both" else [opts.mode]
    counts = rank_counts(opts.ranks, slots)
    plans = [(mode, n, per_rank_samples(mode, trainer.step.target_samples, n)) for mode in modes for n in counts]
    results: list[dict[str, Any]] = []
    done: dict[tuple[int, int], dict[str, Any]] = {}  # (ranks, samples per rank) -> the run's result.json
    for mode, n, per_rank in plans:
        if (n, per_rank) in done:  # e.g. one rank: weak and strong are the same run
            results.append({**done[(n, per_rank)], "mode": mode})
            continue
        run_dir = out_dir / (f"ranks{n}" if mode == "weak" else f"{mode}-ranks{n}")
        program = [
            "--result",
            str(run_dir / "result.json"),
            "--ceiling_repeats",
            str(opts.ceiling_repeats),
            "--",
            *trainer_args,
            *extra,
            "--out_dir",
            str(run_dir),
            "--save_renders",
            "0",
            "--target_samples",
            str(per_rank),
        ]
        launch = plan(launch_options(["-np", str(n), *launch_opts]), os.environ, program, trainer.runtime.comm)
        print(
            f"scaling ({mode}): {n} rank(s), {per_rank} samples/rank/step: {launch.shell_line()}",
            file=sys.stderr,
            flush=True,
        )
        try:
            proc = subprocess.run(launch.command, env={**os.environ, **launch.env}, timeout=opts.timeout_s or None)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{n} rank(s) did not finish within --timeout_s {opts.timeout_s:g}") from None
        if proc.returncode != 0:
            raise BenchError(f"{n} rank(s) failed with exit status {proc.returncode} (output above)")
        done[(n, per_rank)] = json.loads((run_dir / "result.json").read_text())
        results.append({**done[(n, per_rank)], "mode": mode})

    rows = summarize(results, targets)
    text = render(rows, results, targets)
    print("\n" + text, flush=True)
    last = results[-1]
    summary = {
        "command": "python -m hvd_ngp.bench scaling " + shlex.join(argv),
        "date": stamp,
        "host": socket.gethostname(),
        "device": last["device"],
        "launcher": opts.launcher,
        "communication": last["communication"],
        "rows": rows,
        "runs": results,
    }
    json_path = Path(opts.json or out_dir / "scaling.json")
    write_json(json_path, summary)
    print(f"\nwrote {json_path}", flush=True)
    if opts.markdown not in ("", "none"):
        c = last["communication"]
        allreduce = describe_allreduce(c["hierarchical_allreduce"], last["device"] != "cpu")
        how = {
            "weak": f"weak scaling ({trainer.step.target_samples} samples per rank and step)",
            "strong": f"strong scaling ({trainer.step.target_samples} samples per step over all ranks)",
            "both": f"weak and strong scaling ({trainer.step.target_samples} samples per step per rank, and over "
            f"all ranks)",
        }[opts.mode]
        settings = (
            f"{how}; {last['device']} on {socket.gethostname()}, {opts.launcher}, controller {last['controller']}; "
            f"fusion {c['fusion_threshold_mb']:g} MiB, cycle {c['cycle_time_ms']:g} ms, compression "
            f"{c['compression']}, {c['reduce_op']}, {allreduce}, "
            f"lr x{c['lr_multiplier']:.3g} at {last['ranks']} ranks; "
            f"{last['steps']} steps per run. Throughput: log intervals after the first; time to PSNR: "
            f"training seconds (evaluation excluded) at the first evaluation reaching it. {opts.note}"
        )
        append_markdown(opts.markdown, "Scaling", f"{settings.strip()}\n\n{text}", ["scaling", *argv])
        print(f"appended to {opts.markdown}", flush=True)
    return 0
