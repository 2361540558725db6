"""Horovod's real allreduce over emulated links beside the fabric model's projection.

    python -m hvd_ngp.bench links --hosts 2,4 --rates 1gbit,10gbit --sizes_mib 1,4,16,64

For each host count and link rate this creates simulated hosts (``python -m hvd_ngp.simhosts up --rate``:
network namespaces joined by a bridge, every host link shaped by ``tc``; needs root), launches one rank
per host with ``hvd-ngp-launch`` under each controller (Gloo, MPI), times Horovod's allreduce of CPU
tensors of each size (``bench._links_rank``), and puts the time beside ``fabric_model.emulated_allreduce_s``
with the ratio. Hierarchical allreduce is not measured: Horovod's is NCCL + MPI and does nothing for CPU
tensors. Open MPI runs its ring allreduce and yields when idle (``MPI_ENV``). Rows whose ratio leaves [1 - tolerance, 1 + tolerance] are listed as misses (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..cluster import fabric_model as fm
from ..errors import ConfigError
from ..options import options_from
from .report import append_markdown, table, write_json

SIMHOSTS = [sys.executable, "-m", "hvd_ngp.simhosts"]
#: Open MPI: yield in the progress loop (it spins otherwise, and with fewer cores than simulated hosts the
#: spinning ranks starve the kernel's TCP work) and the ring allreduce (coll/tuned algorithm 4), the algorithm
#: the model describes; the fixed decision rules pick per size and rank count and are not modelled.
MPI_ENV = [
    "--env",
    "OMPI_MCA_mpi_yield_when_idle=1",
    "--env",
    "OMPI_MCA_coll_tuned_use_dynamic_rules=1",
    "--env",
    "OMPI_MCA_coll_tuned_allreduce_algorithm=4",
]


def _run(command: list[str], what: str, timeout: float) -> str:
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "HOROVOD_START_TIMEOUT": "120"},
    )
    out = proc.stdout + proc.stderr
    if proc.returncode:
        raise ConfigError(f"bench links: {what} failed (exit {proc.returncode}): {out[-2000:]}")
    return out


def measure(
    hosts: int, rate: str, controllers: list[str], sizes_mib: list[float], repeats: int, timeout: float = 600
) -> list[dict]:
    """Measured rows {hosts, rate_bps, controller, mib, bytes, measured_s} on ``hosts`` simulated hosts."""
    name = f"L{os.getpid()}"
    _run([*SIMHOSTS, "up", "--name", name, "--hosts", str(hosts), "--rate", rate], "simhosts up", 60)
    rows = []
    try:
        hostfile = f"{os.environ.get('HVD_NGP_SIMHOSTS_DIR', '/tmp/hvd_ngp_simhosts')}/{name}/hostfile"
        for controller in controllers:
            with tempfile.TemporaryDirectory() as tmp:
                result = Path(tmp, "result.json")
                _run(
                    [
                        *SIMHOSTS,
                        "run",
                        name,
                        "--",
                        sys.executable,
                        "-m",
                        "hvd_ngp.launch",
                        "--hostfile",
                        hostfile,
                        "--iface",
                        "simnet0",
                        "--fabric",
                        "eth",
                        "--launcher",
                        "horovodrun",
                        "--controller",
                        controller,
                        *(MPI_ENV if controller == "mpi" else []),
                        "--module",
                        "hvd_ngp.bench._links_rank",
                        "--",
                        "--result",
                        str(result),
                        "--sizes_mib",
                        ",".join(f"{s:g}" for s in sizes_mib),
                        "--repeats",
                        str(repeats),
                    ],
                    f"allreduce on {hosts} hosts ({controller}, {rate})",
                    timeout,
                )
                data = json.loads(result.read_text())
            for r in data["rows"]:
                rows.append(
                    {
                        "hosts": hosts,
                        "rate": rate,
                        "rate_bps": fm.parse_rate_bps(rate),
                        "controller": controller,
                        "mib": r["mib"],
                        "bytes": r["bytes"],
                        "measured_s": r["best_s"],
                        "median_s": r["median_s"],
                    }
                )
    finally:
        _run([*SIMHOSTS, "down", name], "simhosts down", 60)
    return rows


def compare(rows: list[dict], tolerance: float, alpha_s: dict[str, float] | None = None) -> list[dict]:
    """Adds modelled_s, ratio (measured / modelled) and ok (within ``tolerance``); ``alpha_s``: per-step latency
    per controller (default: the model's fitted ``EMULATED_ALPHA_S``)."""
    for r in rows:
        r["modelled_s"] = fm.emulated_allreduce_s(r["bytes"], r["hosts"], r["rate_bps"], r["controller"], alpha_s)
        r["ratio"] = r["measured_s"] / r["modelled_s"]
        r["ok"] = abs(r["ratio"] - 1) <= tolerance
    return rows


@dataclass(frozen=True)
class LinksOptions:
    """The command line of ``python -m hvd_ngp.bench links`` (``main``'s parser holds each option's help)."""

    hosts: str
    rates: str
    sizes_mib: str
    controllers: str
    repeats: int
    tolerance: float
    refit: bool
    json: str
    markdown: str


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.bench links", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--hosts", default="2,4", help="comma-separated simulated host counts (one rank each)")
    p.add_argument("--rates", default="1gbit", help="comma-separated link rates (tc), e.g. 1gbit,10gbit")
    p.add_argument("--sizes_mib", default="1,4,16,64")
    p.add_argument("--controllers", default="gloo,mpi")
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed allreduces per size after one warm-up; the best is compared (CPU contention on a shared "
        "machine only adds time; the shaped link sets the floor)",
    )
    p.add_argument("--tolerance", type=float, default=0.25, help="allowed |measured / modelled - 1|")
    p.add_argument(
        "--refit",
        action="store_true",
        help="model with the latency per step fitted to these rows instead of fabric_model.EMULATED_ALPHA_S",
    )
    p.add_argument("--json", default="runs/bench/links.json")
    p.add_argument(
        "--markdown", default="", help="append a dated 'emulated links' section here (e.g. docs/BENCHMARKS.md)"
    )
    opts = options_from(LinksOptions, p.parse_args(argv))
    try:
        hosts = [int(h) for h in opts.hosts.split(",")]
        sizes = [float(s) for s in opts.sizes_mib.split(",")]
    except ValueError:
        raise ConfigError("--hosts and --sizes_mib take comma-separated numbers") from None
    controllers = [c.strip() for c in opts.controllers.split(",")]
    if any(c not in ("gloo", "mpi") for c in controllers):
        raise ConfigError(f"--controllers: gloo and/or mpi, got {opts.controllers!r}")
    rows = []
    for rate in opts.rates.split(","):
        fm.parse_rate_bps(rate)
        for n in hosts:
            rows += measure(n, rate, controllers, sizes, opts.repeats)
    refit = fm.fit_alpha(rows)
    compare(rows, opts.tolerance, {**fm.EMULATED_ALPHA_S, **refit} if opts.refit else None)
    alphas = {**fm.EMULATED_ALPHA_S, **refit} if opts.refit else fm.EMULATED_ALPHA_S
    shown = [
        {
            "hosts": r["hosts"],
            "rate": r["rate"],
            "controller": r["controller"],
            "MiB": f"{r['mib']:g}",
            "best ms": f"{r['measured_s'] * 1e3:.1f}",
            "median ms": f"{r['median_s'] * 1e3:.1f}",
            "modelled ms": f"{r['modelled_s'] * 1e3:.1f}",
            "ratio": f"{r['ratio']:.2f}",
            "within": "yes" if r["ok"] else "NO",
        }
        for r in rows
    ]
    misses = [r for r in rows if not r["ok"]]
    text = (
        f"Horovod allreduce of fp32 CPU tensors, one rank per simulated host, links shaped by tc: measured "
        f"(best and median of {opts.repeats}; the best is compared) beside modelled (fabric_model.emulated_allreduce_s); hierarchical "
        f"allreduce is a no-op on CPU tensors, so not measured. Model: 2 (n-1)/n x S at the set rate's TCP goodput "
        f"({fm.TCP_GOODPUT:.3f}) + 2 (n-1) x alpha, alpha per step "
        + ", ".join(f"{c} {a * 1e3:.1f} ms" for c, a in alphas.items() if c in refit)
        + (
            ""
            if opts.refit
            else " (fabric_model.EMULATED_ALPHA_S; refit to these rows: "
            + ", ".join(f"{c} {a * 1e3:.1f} ms" for c, a in refit.items())
            + ")"
        )
        + f". {len(rows) - len(misses)}/{len(rows)} within +-{opts.tolerance:.0%}.\n\n"
        + table(shown, list(shown[0]))
    )
    print(text)
    if opts.json:
        write_json(
            opts.json,
            {
                "rows": rows,
                "tolerance": opts.tolerance,
                "emulated": True,
                "alpha_s": alphas,
                "refit_alpha_s": refit,
                "tcp_goodput": fm.TCP_GOODPUT,
            },
        )
    if opts.markdown:
        append_markdown(
            opts.markdown, "Allreduce on emulated links", text, ["links", *(argv if argv is not None else sys.argv[1:])]
        )
    return 1 if misses else 0
