"""Projected gradient exchange on a fabric: exposed communication per step and efficiency for N = 1..64 GPUs.

    python -m hvd_ngp.bench fabric --step_ms 3.3 --grad_mib 46.5 --preset ib4,eth2x2
    python -m hvd_ngp.bench fabric --from_json runs/bench/throughput.json --preset ib4 --json runs/bench/fabric.json
    python -m hvd_ngp.bench fabric --step_ms 3.3 --grad_mib 46.5 --preset ib4 --steps_json runs/steps_to_psnr.json

Nothing here is measured: the numbers come from the alpha-beta model in ``hvd_ngp.cluster.fabric_model``
(formulae and preset sources: docs/scaling.md), fed with a measured one-GPU step time and gradient size.
``--steps_json`` adds the projected time-to-PSNR at N = K ranks from one-GPU runs with K backward passes
per step, and where a larger batch stops helping.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from ..cluster import fabric_model as fm
from ..errors import ConfigError
from ..options import options_from
from .report import comma_list, table, write_json

PROJECTED = "PROJECTED by the alpha-beta model (docs/scaling.md), not measured"
DEFAULT_MODES = "flat,hierarchical,hierarchical-rdma,fp16,accum{k},delayed,delayed_grid,periodic{h},delayed_grid+fp16"


def read_json(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def from_throughput(path: str, backend: str | None) -> tuple[float, float, str, float]:
    """(step ms, gradient bytes, what, the MLPs' gradient bytes) from a ``bench throughput`` JSON: the named backend, else the fastest."""
    data = read_json(path)
    runs = [
        r for r in data.get("training", []) if isinstance(r, dict) and (backend is None or r.get("backend") == backend)
    ]
    if not runs:
        raise ConfigError(f"{path}: no 'training' entry{f' for backend {backend}' if backend else ''}")
    run = min(runs, key=lambda r: r.get("step_ms", float("inf")))
    groups = run.get("gradient_bytes")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(
            f"{path}: the {run.get('backend')} entry has no 'gradient_bytes' (rerun bench throughput "
            "with this version, or give --grad_mib)"
        )
    what = (
        f"{data.get('device', '?')}, {run.get('backend')} {run.get('precision')}, "
        f"{run.get('samples_per_step', 0):.0f} samples/step, gradient groups "
        + ", ".join(f"{k} {v / fm.MIB:.2f} MiB" for k, v in groups.items())
    )
    return (
        float(run["step_ms"]),
        float(sum(groups.values())),
        what,
        float(sum(v for k, v in groups.items() if "mlp" in k)),
    )


def parse_ints(text: str, what: str) -> list[int]:
    values = comma_list(text, int, what)
    if not values or any(v < 1 or v > 64 for v in values):
        raise ConfigError(f"--{what} values must be 1..64, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.bench fabric", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_argument_group("the measured one-GPU step")
    src.add_argument("--step_ms", type=float, help="one backward pass + optimizer step on one GPU, ms")
    src.add_argument("--grad_mib", type=float, help="gradient bytes per step in MiB (what one allreduce moves)")
    src.add_argument("--from_json", metavar="FILE", help="a bench throughput JSON (step_ms and gradient_bytes)")
    src.add_argument("--backend", default=None, help="with --from_json: that backend's entry (default: the fastest)")
    src.add_argument(
        "--mlp_kib",
        type=float,
        default=None,
        help="the MLPs' part of the gradient in KiB, what delayed_grid waits for (default: the JSON's "
        f"*mlp groups, else base.json's {fm.DEFAULT_MLP_BYTES / 1024:.1f} KiB)",
    )
    fab = p.add_argument_group("the fabric")
    fab.add_argument(
        "--preset",
        default="ib4",
        help=f"comma-separated presets: clusters {', '.join(fm.CLUSTERS)}; networks {', '.join(fm.NETS)}; "
        f"single nodes {', '.join(fm.NODES)}",
    )
    fab.add_argument("--node", choices=tuple(fm.NODES), default=None, help="the node inside each network preset")
    fab.add_argument("--nodes", type=int, default=None, help="nodes (overrides the preset)")
    fab.add_argument("--gpus_per_node", type=int, default=None, help="GPUs per node (overrides the preset)")
    fab.add_argument("--ranks", default=None, help="comma-separated N (default: 1, 2, 4, ... up to the fabric's GPUs)")
    mod = p.add_argument_group("exchange modes")
    mod.add_argument("--modes", default=None, help=f"comma-separated modes (default: {DEFAULT_MODES})")
    mod.add_argument("--accumulate", type=int, default=4, help="K in the default accumK mode")
    mod.add_argument("--period", type=int, default=8, help="H in the default periodicH mode")
    ttq = p.add_argument_group("time to quality")
    ttq.add_argument("--steps_json", metavar="FILE", help="steps-to-PSNR per K measured on one GPU")
    ttq.add_argument("--psnr", default=None, help="the steps_to_psnr key (default: every key in the file)")
    ttq.add_argument("--ttq_modes", default="flat,delayed_grid+fp16", help="modes for the time-to-quality table")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows here")
    return p


def default_ranks(f: fm.Fabric) -> list[int]:
    total, n, out = f.nodes * f.gpus_per_node, 1, []
    while n < total:
        out.append(n)
        n *= 2
    return out + [total]


def ttq_tables(
    steps: dict,
    source: str,
    grad_bytes: float,
    fabrics: list[fm.Fabric],
    modes: list[fm.Mode],
    psnrs: list[str],
    mlp_bytes: float = 0.0,
) -> tuple[list[str], list[dict]]:
    texts, rows = [], []
    for psnr in psnrs:
        for f in fabrics:
            for mode in modes:
                part = fm.time_to_quality(steps, grad_bytes, f, psnr, mode, source, mlp_bytes)
                crit = fm.critical_batch(part)
                for r in part:
                    r.update(fabric=f.name, mode=mode.spec, psnr=psnr)
                rows += part
                shown = [
                    {
                        "N": r["ranks"],
                        "seeds": r["seeds"],
                        "steps": "not reached" if r["steps"] is None else f"{r['steps']:.0f}",
                        "steps of": r["steps_of"] if r["steps_of"] == mode.sync else f"{r['steps_of']} (*)",
                        "step ms": f"{r['step_ms']:.2f}",
                        "exposed ms": f"{r['exposed_comm_ms']:.2f}",
                        f"time to {psnr} dB s": "-" if r["time_s"] is None else f"{r['time_s']:.1f}",
                        "speedup": "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                        "steps scaling": "-" if r["scaling"] is None else f"{r['scaling']:.0%}",
                    }
                    for r in part
                ]
                scene = steps.get("scene", "?")
                verdict = (
                    f"critical batch: steps fall at least {fm.CRITICAL_SCALING:.0%} of 1/N up to N = {crit['ranks']}; "
                    if crit["ranks"]
                    else "critical batch: steps fall less than half of 1/N already at the second N; "
                )
                verdict += (
                    f"fastest projected time at N = {crit['fastest']}" if crit["fastest"] else "no N reached the PSNR"
                )
                if any(r["steps_of"] != mode.sync for r in part[1:]):
                    verdict += (
                        f"\n(*) the steps JSON has no {mode.sync} runs at that N: every's steps, so {mode.spec}'s own "
                        "quality cost is not counted there"
                    )
                texts.append(
                    f"Time to {psnr} dB on {scene} ({steps.get('device', '?')}), fabric {f.name}, mode "
                    f"{mode.spec} [{PROJECTED}; steps measured on one GPU with K = N backward passes]:\n\n"
                    + table(shown, list(shown[0]))
                    + "\n"
                    + verdict
                )
    return texts, rows


@dataclass(frozen=True)
class FabricOptions:
    """The command line of ``python -m hvd_ngp.bench fabric`` (``build_parser`` holds each option's help)."""

    step_ms: float | None
    grad_mib: float | None
    from_json: str | None
    backend: str | None
    mlp_kib: float | None
    preset: str
    node: str | None
    nodes: int | None
    gpus_per_node: int | None
    ranks: str | None
    modes: str | None
    accumulate: int
    period: int
    steps_json: str | None
    psnr: str | None
    ttq_modes: str
    json: str | None


def main(argv: list[str] | None = None) -> dict:
    opts = options_from(FabricOptions, build_parser().parse_args(argv))
    if opts.from_json:
        if opts.step_ms is not None or opts.grad_mib is not None:
            raise ConfigError("give either --from_json or --step_ms/--grad_mib, not both")
        step_ms, grad_bytes, what, mlp_bytes = from_throughput(opts.from_json, opts.backend)
        what = f"from {opts.from_json}: {what}"
    else:
        if opts.step_ms is None or opts.grad_mib is None:
            raise ConfigError("give --step_ms and --grad_mib, or --from_json a bench throughput JSON")
        step_ms, grad_bytes, mlp_bytes = opts.step_ms, opts.grad_mib * fm.MIB, float(fm.DEFAULT_MLP_BYTES)
        what = "given on the command line"
    if opts.mlp_kib is not None:
        mlp_bytes = opts.mlp_kib * 1024
    if opts.accumulate < 1 or opts.period < 1:
        raise ConfigError("--accumulate and --period must be >= 1")
    modes = [
        fm.Mode.parse(m) for m in (opts.modes or DEFAULT_MODES.format(k=opts.accumulate, h=opts.period)).split(",")
    ]
    fabrics = [
        fm.fabric(name.strip(), opts.nodes, opts.gpus_per_node, opts.node)
        for name in opts.preset.split(",")
        if name.strip()
    ]
    header = f"{PROJECTED}. One GPU: {step_ms:.3g} ms per step, {grad_bytes / fm.MIB:.2f} MiB of gradient ({what})."
    texts, rows = [header], []
    for f in fabrics:
        ranks = parse_ints(opts.ranks, "ranks") if opts.ranks else default_ranks(f)
        part = fm.project(step_ms, grad_bytes, ranks, f, modes, mlp_bytes)
        rows += part
        shown = [
            {
                "N": r["ranks"],
                "nodes": r["nodes"],
                "mode": r["mode"],
                "comm ms": f"{r['comm_ms']:.2f}",
                "exposed ms": f"{r['exposed_comm_ms']:.2f}",
                "exposed/step": f"{r['exposed_comm_ms'] / step_ms:.0%}",
                "efficiency": f"{r['efficiency']:.0%}",
            }
            for r in part
        ]
        texts.append(
            f"Fabric {f.name}: {f.nodes} node(s) x {f.gpus_per_node} GPUs; inside a node {f.intra.name} "
            f"{f.intra.gbs:g} GB/s; between nodes {f.inter.name} {f.inter.gbs:g} GB/s per node, MPI "
            f"{f.mpi_tcp.gbs:g} GB/s over TCP, {f.mpi_rdma.gbs:g} GB/s over RDMA "
            f"[{PROJECTED}]\n\n" + table(shown, list(shown[0]))
        )
    ttq_rows: list[dict] = []
    if opts.steps_json:
        steps = read_json(opts.steps_json)
        keys = (
            sorted({k for r in steps.get("runs", []) if isinstance(r, dict) for k in (r.get("steps_to_psnr") or {})})
            if opts.psnr is None
            else [opts.psnr]
        )
        if not keys:
            raise ConfigError(f"{opts.steps_json}: no steps_to_psnr keys in 'runs'")
        if steps.get("shared_device"):  # bench batch --parallel: its step times are not one GPU's alone
            steps = {**steps, "step_ms_per_backward_pass": step_ms}
            texts.append(
                f"{opts.steps_json}: its runs shared one device (bench batch --parallel), so each step is priced "
                f"at the {step_ms:.3g} ms above, not at the runs' own step times."
            )
        ttq_modes = [fm.Mode.parse(m) for m in opts.ttq_modes.split(",")]
        more, ttq_rows = ttq_tables(steps, opts.steps_json, grad_bytes, fabrics, ttq_modes, keys, mlp_bytes)
        texts += more
    print("\n\n".join(texts))
    result = {
        "projected": True,
        "note": PROJECTED,
        "step_ms": step_ms,
        "grad_bytes": grad_bytes,
        "mlp_bytes": mlp_bytes,
        "source": what,
        "rows": rows,
        "time_to_psnr": ttq_rows,
    }
    if opts.json:
        write_json(opts.json, result)
    return result
