"""Environment doctor: is every rank running the same software, and does the allreduce work?

    horovodrun -np 16 -hostfile hostfiles/ib4 python -m hvd_ngp.doctor [--dump-topology topo.{host}.xml]
    mpirun -np 16 --hostfile hostfiles/ib4 hvd-ngp-doctor
    python -m hvd_ngp.doctor                      # size 1, no launcher: this machine only

Every rank describes itself (Python, torch, CUDA, NCCL, Horovod and what it was built with, MPI,
driver, GPU, the NCCL_*/HOROVOD_* variables, host); rank 0 prints one table in which values that
differ across ranks are marked, then an allreduce is checked for exact results and timed.
Exit status: 0 all good, 1 a mismatch of a package that must match (the message names the rank
and the package) or a failed check, 2 bad usage. Differences in hardware, driver and variables
are warnings (``--strict`` makes them failures).

``HVD_NGP_DOCTOR_TEST_OVERRIDE="horovod=0.27.0,torch=2.0"`` replaces this rank's values before
the comparison. It exists for testing the mismatch path and is reported in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .. import __version__
from ..cluster import dist, nccl_net
from ..errors import ConfigError, HvdNgpError
from ..launcher_env import LOCAL_RANK_VARS, LOCAL_SIZE_VARS, RANK_VARS, SIZE_VARS, env_int, launcher_rank_label
from ..options import options_from

OVERRIDE_VAR = "HVD_NGP_DOCTOR_TEST_OVERRIDE"

MUST, SHOULD, INFO = "must match", "should match", "info"

#: (key, label, policy): the rows of the table, in order; the label names the package in messages
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("host", "host", INFO),
    ("device", "device", INFO),
    ("gpu", "GPU", SHOULD),
    ("python", "python", MUST),
    ("hvd_ngp", "hvd_ngp", MUST),
    ("torch", "torch", MUST),
    ("torch_cuda", "CUDA (torch)", MUST),
    ("nccl_torch", "NCCL (torch)", MUST),
    ("horovod", "horovod", MUST),
    ("horovod_built", "horovod built with", MUST),
    ("controller", "horovod controller", MUST),
    ("mpi", "MPI (mpirun)", MUST),
    ("numpy", "numpy", MUST),
    ("driver", "NVIDIA driver", SHOULD),
    ("cuda_driver", "CUDA (driver)", SHOULD),
)
LABELS = {key: label for key, label, _ in FIELDS}
#: variables that differ from rank to rank by design: neither compared nor shown
PER_RANK_VARS = re.compile(r"RANK|HOSTNAME|^NCCL_TOPO_DUMP_FILE$")


# ------------------------------------------------------------------------------------ gathering


def _safe(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except Exception as exc:  # a doctor reports what it cannot find out; it must not stop the other ranks
        return f"error: {type(exc).__name__}: {exc}"


def _gpu(device: torch.device) -> str:
    if device.type != "cuda":
        return "none"
    p = torch.cuda.get_device_properties(device)
    return f"{p.name}, {p.total_memory / (1 << 30):.1f} GiB, sm_{p.major}{p.minor}"


def _nccl_torch() -> str:
    if not torch.cuda.is_available() and torch.version.cuda is None:
        return "none (CPU build of torch)"
    version = torch.cuda.nccl.version()
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def _mpi() -> str:
    exe = shutil.which("mpirun")
    if exe is None:
        return "not found"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def _driver(device: torch.device) -> tuple[str, str]:
    """(driver version, CUDA version the driver supports) from NVML."""
    if device.type != "cuda":
        return "n/a (no GPU)", "n/a (no GPU)"
    try:
        import pynvml
    except ImportError:
        return "n/a (nvidia-ml-py not installed)", "n/a (nvidia-ml-py not installed)"
    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return (driver.decode() if isinstance(driver, bytes) else str(driver)), f"{cuda // 1000}.{cuda % 1000 // 10}"
    finally:
        pynvml.nvmlShutdown()


def collect(device: torch.device) -> dict[str, Any]:
    """This rank's description: every FIELDS key, plus ``env`` (NCCL_*/HOROVOD_* variables) and ``rank``."""
    import numpy

    rt = dist.runtime()
    hvd = dist.horovod_info()
    try:
        driver, cuda_driver = _driver(device)
    except Exception as exc:
        driver = cuda_driver = f"error: {type(exc).__name__}: {exc}"
    record = {
        "rank": rt.rank,
        "host": socket.gethostname(),
        "device": str(device),
        "gpu": _safe(lambda: _gpu(device)),
        "python": platform.python_version(),
        "hvd_ngp": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda or "none (CPU build)",
        "nccl_torch": _safe(_nccl_torch),
        "horovod": hvd["version"],
        "horovod_built": hvd["built"],
        "controller": hvd["controller"],
        "mpi": _safe(_mpi),
        "numpy": numpy.__version__,
        "driver": driver,
        "cuda_driver": cuda_driver,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "HOROVOD_"))},
        "overridden": [],
    }
    return apply_test_override(record, os.environ.get(OVERRIDE_VAR, ""))


def apply_test_override(record: dict[str, Any], spec: str) -> dict[str, Any]:
    """``"horovod=0.27.0,torch=2.0"`` -> those values replaced (testing the mismatch path only)."""
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in LABELS:
            raise ConfigError(f"{OVERRIDE_VAR}={spec!r}: expected key=value with key one of {', '.join(LABELS)}")
        record[key] = value
        record["overridden"].append(key)
    return record


# ------------------------------------------------------------------------------------ comparing


@dataclass(frozen=True)
class Finding:
    """One rank whose value differs from the majority (or a failed check on one rank)."""

    severity: str  # "error" | "warning"
    what: str  # package, variable or check
    rank: int
    host: str
    message: str


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


def groups(values: list[str], ranks: list[int] | None = None) -> list[tuple[str, list[int]]]:
    """Ranks grouped by value, the reference (most ranks; ties: the lowest rank's side) first.

    ``values[i]`` belongs to rank ``ranks[i]`` (default: rank i).
    """
    ranks = list(range(len(values))) if ranks is None else ranks
    count = Counter(values)
    order = sorted(count, key=lambda v: (-count[v], values.index(v)))
    return [(v, [r for r, x in zip(ranks, values) if x == v]) for v in order]


def compare_values(what: str, values: list[str], hosts: list[str], severity: str) -> list[Finding]:
    """A finding for every rank whose value differs from the reference group's (undetermined values skipped)."""
    known = [r for r, v in enumerate(values) if not v.startswith("error:")]
    if not known:
        return []
    found = []
    (ref, ref_ranks), *others = groups([values[r] for r in known], known)
    for value, ranks in others:
        for r in ranks:
            found.append(
                Finding(
                    severity,
                    what,
                    r,
                    hosts[r],
                    f"{what}: rank {r} ({hosts[r]}) has {value!r}, but rank(s) {rank_ranges(ref_ranks)} have {ref!r}",
                )
            )
    return found


def env_table(records: list[dict]) -> dict[str, list[str]]:
    """NCCL_*/HOROVOD_* variable -> its value on every rank ('(unset)' where missing)."""
    names = sorted({k for rec in records for k in rec["env"]})
    return {k: [rec["env"].get(k, "(unset)") for rec in records] for k in names}


def compare(records: list[dict], strict: bool = False) -> list[Finding]:
    """Everything that differs across ranks, and every value a rank could not determine."""
    hosts = [rec["host"] for rec in records]
    warn = "error" if strict else "warning"
    found: list[Finding] = []
    for key, label, policy in FIELDS:
        values = [str(rec[key]) for rec in records]
        for r, v in enumerate(values):
            if v.startswith("error:"):
                found.append(
                    Finding(
                        "error",
                        label,
                        r,
                        hosts[r],
                        f"{label}: could not be determined on rank {r} ({hosts[r]}): {v[len('error: ') :]}",
                    )
                )
        if policy != INFO:
            found += compare_values(label, values, hosts, "error" if policy == MUST else warn)
    for name, values in env_table(records).items():
        if not PER_RANK_VARS.search(name):
            found += compare_values(name, values, hosts, warn)
    return found


# ------------------------------------------------------------------------------------ the table


def render_table(records: list[dict], findings: list[Finding], color: bool = False) -> str:
    """One table: a row per field (and variable), one line per distinct value, marks on the odd ones out."""
    rt_size = len(records)
    hosts = sorted({rec["host"] for rec in records})
    flagged = {(f.what, f.rank): f.severity for f in findings}
    red, yellow, reset = ("\033[31m", "\033[33m", "\033[0m") if color else ("", "", "")
    rows: list[tuple[str, str, list[str]]] = [
        (label, key, [str(rec[key]) for rec in records]) for key, label, _ in FIELDS
    ]
    rows += [(name, name, values) for name, values in env_table(records).items() if not PER_RANK_VARS.search(name)]
    width = max(len(label) for label, _, _ in rows) + 2
    vwidth = min(max((len(v) for _, _, vals in rows for v in vals), default=10), 72)
    lines = [
        f"hvd_ngp doctor: {rt_size} rank(s) on {len(hosts)} host(s): {', '.join(hosts)}",
        f"   {'field':<{width}}{'value':<{vwidth}}  ranks",
    ]
    for label, _, values in rows:
        for i, (value, ranks) in enumerate(groups(values)):
            sev = next((flagged[(label, r)] for r in ranks if (label, r) in flagged), None)
            mark, tint = {"error": ("!! ", red), "warning": (" ! ", yellow)}.get(sev or "", ("   ", ""))
            shown = value if len(value) <= vwidth else value[: vwidth - 3] + "..."
            who = "all" if len(ranks) == rt_size else rank_ranges(ranks)
            note = {"error": "  <- MISMATCH", "warning": "  <- differs"}.get(sev or "", "")
            name = label if i == 0 or sev else ""  # a marked line names its field, for grep
            lines.append(f"{tint}{mark}{name:<{width}}{shown:<{vwidth}}  {who}{note}{reset if tint else ''}")
    for rec in records:
        if rec["overridden"]:
            lines.append(
                f"note: rank {rec['rank']} values replaced by {OVERRIDE_VAR} (testing only): "
                f"{', '.join(rec['overridden'])}"
            )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ checks


def check_allreduce(device: torch.device, mib: float, iterations: int) -> dict[str, Any]:
    """Exact Sum and Max allreduces of small integers (every rank), then ``iterations`` timed allreduces of
    ``mib`` MiB fp32. Collective: every rank calls it. Returns this rank's results."""
    rt = dist.runtime()
    n_big = max(int(mib * (1 << 20)) // 4, 1)
    pattern, big = dist.agree(lambda: _test_tensors(device, n_big), "allocating the test tensors")
    mine = pattern * (rt.rank + 1)
    # integers below 2^24 add exactly in fp32 in any order: the results must be bit-exact
    sum_ok = bool(torch.equal(dist.allreduce(mine, "sum", name="doctor.sum"), pattern * (rt.size * (rt.size + 1) // 2)))
    max_ok = bool(torch.equal(dist.allreduce(mine, "max", name="doctor.max"), pattern * rt.size))
    times: list[float] = []
    if rt.size > 1 and iterations > 0:
        for i in range(iterations + 2):  # two warm-ups: NCCL/Gloo set up connections on first use
            _sync(device)
            start = time.perf_counter()
            dist.allreduce(big, "sum", name="doctor.bandwidth")
            _sync(device)
            if i >= 2:
                times.append(time.perf_counter() - start)
    return {
        "sum_ok": sum_ok,
        "max_ok": max_ok,
        "seconds": sum(times) / len(times) if times else None,
        "bytes": n_big * 4,
    }


def _test_tensors(device: torch.device, n_big: int) -> tuple[torch.Tensor, torch.Tensor]:
    pattern = (torch.arange(1 << 16, device=device) % 7 + 1).float()
    return pattern, torch.ones(n_big, dtype=torch.float32, device=device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------ NCCL topology


@dataclass
class TopologyPlan:
    """Where NCCL should write this node's topology, decided before Horovod (and NCCL) start."""

    path: str  # "" when nothing will be dumped
    writer: bool  # this process is its node's local rank 0: NCCL dumps from it
    rank: int  # global and local rank as the launcher's variables say (checked after init)
    local_rank: int
    reason: str = ""  # why nothing is dumped
    error: str = ""  # why nothing can be dumped although it should be (reported after init)


def plan_topology_dump(path: str, use_cuda: bool) -> TopologyPlan:
    """Set ``NCCL_TOPO_DUMP_FILE``/``NCCL_TOPO_DUMP_FILE_RANK`` so that each node's local rank 0 writes (before init).

    NCCL writes the topology of the node it runs on (every GPU and NIC it detected there, fused
    across the node's ranks) while it builds its first communicator, from the process whose rank in
    that communicator equals ``NCCL_TOPO_DUMP_FILE_RANK``. ``{host}`` in ``path`` becomes the host
    name; on several nodes without ``{host}``, the host name is added before the suffix.
    """
    rank, local_rank = env_int(RANK_VARS, 0), env_int(LOCAL_RANK_VARS, 0)
    size = env_int(SIZE_VARS, 1)
    if not use_cuda:
        return TopologyPlan(
            "",
            False,
            rank,
            local_rank,
            "nothing to dump: NCCL only carries GPU tensors and this run has no GPU "
            "(Gloo and MPI move CPU tensors and detect no topology)",
        )
    if size < 2:
        return TopologyPlan(
            "",
            False,
            rank,
            local_rank,
            "nothing to dump: NCCL builds a communicator only between 2 or more ranks; "
            "run under horovodrun/mpirun with -np 2 or more",
        )
    host = socket.gethostname()
    multi_node = env_int(LOCAL_SIZE_VARS, size) < size
    target = Path(path.replace("{host}", host))
    if "{host}" not in path and multi_node:
        target = target.with_name(f"{target.stem}.{host}{target.suffix}")
    target = target.expanduser().resolve()
    writer = local_rank == 0
    if not target.parent.is_dir():  # the node's ranks share the file system: all of them take this branch
        return TopologyPlan(
            str(target),
            writer,
            rank,
            local_rank,
            error=f"--dump-topology {path}: folder {target.parent} does not exist on {host}",
        )
    if writer:
        target.unlink(missing_ok=True)  # a stale file must not pass for this run's
    # Every rank of the node must set the file: NCCL (2.19+) builds the topology to dump with an
    # intra-node exchange on every rank where the variable is set, so setting it on some ranks
    # only would leave the others out of that exchange. The rank variable picks the one writer:
    # its rank in NCCL's first communicator, the global one (rank = Horovod rank) or, with
    # hierarchical allreduce on several nodes, the node-local one (rank = local rank = 0).
    hierarchical = os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE", "0") not in ("", "0") and multi_node
    os.environ["NCCL_TOPO_DUMP_FILE"] = str(target)
    os.environ["NCCL_TOPO_DUMP_FILE_RANK"] = ("0" if hierarchical else str(rank)) if writer else "-1"
    return TopologyPlan(str(target), writer, rank, local_rank)


def topology_result(plan: TopologyPlan | None) -> dict[str, Any]:
    """After the GPU allreduce: did NCCL write this node's file? (``ok`` False is a failure.)"""
    if plan is None:
        return {"ok": True, "text": ""}
    rt = dist.runtime()
    if plan.error:
        return {"ok": not plan.writer, "text": plan.error if plan.writer else ""}  # one report per node
    if plan.reason:
        if rt.device.type == "cuda" and rt.size > 1:  # the launcher's variables did not tell the size
            return {
                "ok": False,
                "text": "could not tell this rank's place before Horovod started (unknown "
                "launcher): set NCCL_TOPO_DUMP_FILE and NCCL_TOPO_DUMP_FILE_RANK yourself",
            }
        return {"ok": True, "text": plan.reason}
    if (plan.rank, plan.local_rank) != (rt.rank, rt.local_rank):
        return {
            "ok": False,
            "text": f"the launcher's variables said rank {plan.rank} / local rank {plan.local_rank}, "
            f"Horovod says {rt.rank} / {rt.local_rank}: NCCL was told the wrong rank",
        }
    if "nccl" not in dist.horovod_info()["built"]:
        return {
            "ok": False,
            "text": "Horovod was built without NCCL, so NCCL never ran (rebuild it with NCCL: see README)",
        }
    if not plan.writer:
        return {"ok": True, "text": ""}
    target = Path(plan.path)
    if target.is_file() and target.stat().st_size > 0:
        return {"ok": True, "text": f"written {target} ({target.stat().st_size} bytes)"}
    return {"ok": False, "text": f"NCCL did not write {target}"}


# ------------------------------------------------------------------------------------ entry point


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd_ngp.doctor",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="device of the allreduce test")
    p.add_argument(
        "--bandwidth-mib",
        type=float,
        default=64.0,
        help="size of the timed allreduce in MiB (64 MiB = the default hash grid's gradient)",
    )
    p.add_argument("--iterations", type=int, default=10, help="timed allreduces (after 2 warm-ups)")
    p.add_argument(
        "--dump-topology",
        metavar="PATH",
        default=None,
        help="write the NCCL topology each node detected ({host} in PATH becomes the host name); "
        "the file NCCL_TOPO_FILE / nccl_topology_file can point at",
    )
    p.add_argument("--json", metavar="PATH", default=None, help="also write every rank's report as JSON (rank 0)")
    p.add_argument("--strict", action="store_true", help="differences in GPU, driver or variables are failures too")
    return p


@dataclass(frozen=True)
class DoctorOptions:
    """The doctor's command line (``build_parser`` holds each option's help)."""

    device: str
    bandwidth_mib: float
    iterations: int
    dump_topology: str | None  # {host} in it becomes the host name
    json: str | None
    strict: bool


def main(argv: list[str] | None = None) -> int:
    """Run the doctor on this rank (every rank calls it); returns the exit status, the same on every rank."""
    opts = options_from(DoctorOptions, build_parser().parse_args(argv))
    if opts.bandwidth_mib <= 0 or opts.iterations < 0:
        raise ConfigError("--bandwidth-mib must be positive and --iterations >= 0")
    use_cuda = dist.wants_cuda(opts.device)
    plan = plan_topology_dump(opts.dump_topology, use_cuda) if opts.dump_topology else None
    if use_cuda:  # NCCL's own report of its transport, read back after the GPU allreduce
        os.environ.update(nccl_net.capture_env(os.environ))
    rt = dist.init(opts.device)
    record = dist.agree(lambda: collect(rt.device), "describing the environment")
    records = dist.allgather_object(record, name="doctor.records")
    findings = compare(records, opts.strict)
    if rt.is_root:
        # mpirun gives ranks a pseudo-terminal even when its own output goes to a file: colour only without one
        color = sys.stdout.isatty() and not dist.launched() and "NO_COLOR" not in os.environ
        print(render_table(records, findings, color), flush=True)

    check = check_allreduce(rt.device, opts.bandwidth_mib, opts.iterations)
    check["topology"] = topology_result(plan)
    net = nccl_net.parse(nccl_net.read_capture())
    severity, text = nccl_net.verdict(net, nccl_net.ib_devices())
    check["nccl_net"] = {**asdict(net), "severity": severity, "text": text}
    checks = dist.allgather_object(check, name="doctor.checks")
    hosts = [rec["host"] for rec in records]
    for r, c in enumerate(checks):
        if not (c["sum_ok"] and c["max_ok"]):
            findings.append(
                Finding(
                    "error",
                    "allreduce",
                    r,
                    hosts[r],
                    f"allreduce: wrong result on rank {r} ({hosts[r]}) "
                    f"(sum {'ok' if c['sum_ok'] else 'WRONG'}, max {'ok' if c['max_ok'] else 'WRONG'})",
                )
            )
        if c["nccl_net"]["severity"] == "warning":
            findings.append(
                Finding("warning", "nccl_net", r, hosts[r], f"rank {r} ({hosts[r]}): {c['nccl_net']['text']}")
            )
        if not c["topology"]["ok"]:
            findings.append(
                Finding("error", "topology", r, hosts[r], f"topology: rank {r} ({hosts[r]}): {c['topology']['text']}")
            )
    errors = [f for f in findings if f.severity == "error"]
    if rt.is_root:
        print(summary(records, checks, findings, rt.device, rt.controller), flush=True)
        if opts.json:
            Path(opts.json).write_text(
                json.dumps(
                    {"records": records, "checks": checks, "ok": not errors, "findings": [asdict(f) for f in findings]},
                    indent=1,
                )
            )
    return 1 if errors else 0


def summary(
    records: list[dict], checks: list[dict], findings: list[Finding], device: torch.device, controller: str
) -> str:
    """The lines under the table: allreduce, bandwidth, topology, verdict."""
    n = len(records)
    c0 = checks[0]
    wrong = [str(r) for r, c in enumerate(checks) if not (c["sum_ok"] and c["max_ok"])]
    lines = [
        f"allreduce: Sum and Max of 64 Ki fp32 on {device.type} across {n} rank(s) ({controller}): "
        + ("exact on every rank" if not wrong else f"WRONG on rank(s) {', '.join(wrong)}")
    ]
    timed = [c["seconds"] for c in checks if c["seconds"] is not None]
    if timed:
        t = max(timed)  # the slowest rank's mean: a collective ends when the last rank is done
        algbw = c0["bytes"] / t / 1e9
        lines.append(
            f"bandwidth: {c0['bytes'] / (1 << 20):.1f} MiB fp32 in {1e3 * t:.2f} ms (slowest rank's mean): "
            f"algbw {algbw:.2f} GB/s, busbw {algbw * 2 * (n - 1) / n:.2f} GB/s"
        )
    else:
        lines.append("bandwidth: not measured (one rank has no one to talk to)")
    topo = [(r, c["topology"]["text"]) for r, c in enumerate(checks) if c["topology"]["text"]]
    if topo and all(text == topo[0][1] for _, text in topo) and not topo[0][1].startswith("written"):
        lines.append(f"topology: {topo[0][1]}")
    else:
        lines += [f"topology: rank {r} ({records[r]['host']}): {text}" for r, text in topo]
    if device.type == "cuda":
        nets = sorted({c["nccl_net"]["text"] for c in checks if c["nccl_net"]["severity"] != "warning"})
        lines += nets if n > 1 else ["NCCL transport between nodes: none (one rank)"]
    errors = [f for f in findings if f.severity == "error"]
    warnings = [f for f in findings if f.severity == "warning"]
    lines += [f"warning: {f.message}" for f in warnings]
    if errors:
        lines.append(f"hvd_ngp doctor: FAILED ({len(errors)} problem(s)):")
        lines += [f"  {f.message}" for f in errors]
    else:
        lines.append("hvd_ngp doctor: OK" + (f" ({len(warnings)} warning(s))" if warnings else ""))
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> None:
    """Console script ``hvd-ngp-doctor``: exit 0 (all good), 1 (mismatch or failed check), 2 (bad usage)."""
    try:
        code = main(argv)
    except HvdNgpError as exc:
        print(f"{launcher_rank_label()}hvd_ngp doctor: error: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)  # after an error Horovod's shutdown can block: leave fast
    sys.stdout.flush()
    dist.shutdown()  # every rank reached this point: a clean shutdown cannot hang
    sys.exit(code)


if __name__ == "__main__":
    cli()
