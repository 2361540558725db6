"""Hosts and slots: hostfiles, SLURM allocations, rank placement, hierarchical allreduce, NCCL presets.

Pure functions without Horovod: the launcher (``hvd_ngp.tools.launch``) uses them before any rank starts,
the trainer (``hvd_ngp.cluster.comm``) to decide what Horovod should do. Every error names its source (the
hostfile and line, the ``-H`` list, or the SLURM variable).

Placement follows horovodrun's and mpirun's default ("by slot"): ranks fill the first host's
slots, then the next host's, in file order; hosts left without a rank are not part of the job.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError

#: host names horovodrun and mpirun accept in ``-H`` lists (names, IPv4 addresses)
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
#: keys a hostfile line may carry after the host name (Open MPI's spelling of max_slots too)
HOSTFILE_KEYS = ("slots", "max_slots", "max-slots")


@dataclass(frozen=True)
class Host:
    """One machine and how many ranks it may run (one per GPU, or per CPU share)."""

    name: str
    slots: int
    line: int = 0  # line in its hostfile; 0 when it came from elsewhere


@dataclass(frozen=True)
class HostList:
    """Hosts in launch order and where they were read from (for error messages)."""

    hosts: tuple[Host, ...]
    source: str

    @property
    def total_slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    def host_arg(self) -> str:
        """``a:2,b:2``: the ``-H`` form both horovodrun and Open MPI's mpirun accept."""
        return ",".join(f"{h.name}:{h.slots}" for h in self.hosts)

    def hostfile_text(self) -> str:
        return "".join(f"{h.name} slots={h.slots}\n" for h in self.hosts)


# ------------------------------------------------------------------------------------- parsing


def _positive_int(text: str, what: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{where}: {what} must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise ConfigError(f"{where}: {what} must be a positive integer, got {value}")
    return value


def _check_name(name: str, where: str) -> None:
    if not _HOST_NAME.match(name):
        raise ConfigError(f"{where}: {name!r} is not a host name (letters, digits, '.', '-', '_'; IPv4 addresses)")


def _no_duplicates(hosts: list[Host], where_of) -> None:
    seen: dict[str, Host] = {}
    for h in hosts:
        if h.name in seen:
            first = seen[h.name]
            raise ConfigError(
                f"{where_of(h)}: host {h.name!r} is listed twice (first at {where_of(first)}); "
                "give each host one entry with its total slots"
            )
        seen[h.name] = h


def parse_hostfile_text(text: str, source: str) -> HostList:
    """Parse ``host slots=N [max_slots=M]`` lines; ``#`` starts a comment; blank lines are ignored."""
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        name, *fields = line.split()
        if ":" in name:
            raise ConfigError(f"{where}: expected 'host slots=N', got {line!r} (host:N is the -H form)")
        _check_name(name, where)
        values: dict[str, str] = {}
        for field in fields:
            key, eq, value = field.partition("=")
            if not eq or not key or not value:
                raise ConfigError(f"{where}: expected key=value after the host name, got {field!r}")
            if key not in HOSTFILE_KEYS:
                raise ConfigError(f"{where}: unknown key {key!r} (known: slots, max_slots)")
            if key.replace("-", "_") in values:
                raise ConfigError(f"{where}: {key} given twice")
            values[key.replace("-", "_")] = value
        if "slots" not in values:
            raise ConfigError(f"{where}: host {name!r} has no slots=N (the number of ranks it runs, e.g. one per GPU)")
        slots = _positive_int(values["slots"], "slots", where)
        if "max_slots" in values and _positive_int(values["max_slots"], "max_slots", where) < slots:
            raise ConfigError(f"{where}: max_slots={values['max_slots']} is less than slots={slots}")
        hosts.append(Host(name, slots, number))
    if not hosts:
        raise ConfigError(f"{source}: the hostfile lists no hosts")
    _no_duplicates(hosts, lambda h: f"{source}:{h.line}")
    return HostList(tuple(hosts), source)


def parse_hostfile(path: str | Path) -> HostList:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: hostfile not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read hostfile: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_hostfile_text(text, str(path))


def parse_host_arg(spec: str) -> HostList:
    """``-H a:2,b:4`` (a host without ``:N`` has one slot)."""
    source = f"-H {spec}"
    hosts = []
    for item in spec.split(","):
        name, colon, slots = item.strip().partition(":")
        _check_name(name, source)
        hosts.append(Host(name, _positive_int(slots, f"slots of {name!r}", source) if colon else 1))
    _no_duplicates(hosts, lambda h: source)
    return HostList(tuple(hosts), source)


# ------------------------------------------------------------------------------------- SLURM


def _split_top_level(text: str, where: str) -> list[str]:
    """Split at commas outside brackets: ``a[1-2,4],b`` -> ``['a[1-2,4]', 'b']``."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"{where}: nested '[' in {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"{where}: unbalanced ']' in {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"{where}: unbalanced '[' in {text!r}")
    items.append(text[start:])
    return [s.strip() for s in items if s.strip()]


def _expand_range_list(body: str, where: str) -> list[str]:
    """``01-03,07`` -> ``['01', '02', '03', '07']`` (zero padding kept)."""
    out: list[str] = []
    for part in body.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ConfigError(f"{where}: bad range {part!r} in '[{body}]'")
        if not dash:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ConfigError(f"{where}: range {part!r} runs backwards")
        width = len(lo)
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return out


def expand_nodelist(spec: str, where: str = "SLURM_JOB_NODELIST") -> list[str]:
    """SLURM's compressed host list -> names: ``gpu[01-02,07],login1`` -> ``gpu01 gpu02 gpu07 login1``."""
    names: list[str] = []
    for item in _split_top_level(spec, where):
        pieces = re.split(r"(\[[^\]]*\])", item)
        choices = [_expand_range_list(p[1:-1], where) if p.startswith("[") else [p] for p in pieces if p]
        names.extend("".join(combo) for combo in product(*choices))
    if not names:
        raise ConfigError(f"{where}: no hosts in {spec!r}")
    return names


def expand_tasks_per_node(spec: str, n_nodes: int, where: str) -> list[int]:
    """SLURM's ``4(x2),2`` -> ``[4, 4, 2]``; a single number applies to every node."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ConfigError(f"{where}: cannot read {spec!r} (expected e.g. '4' or '4(x2),2')")
        counts.extend([_positive_int(m[1], "tasks per node", where)] * (int(m[2]) if m[2] else 1))
    if len(counts) == 1:
        counts *= n_nodes
    if len(counts) != n_nodes:
        raise ConfigError(f"{where}={spec!r} describes {len(counts)} node(s) but the allocation has {n_nodes}")
    return counts


def slurm_hosts(environ: Mapping[str, str]) -> HostList:
    """Hosts and slots of the current SLURM allocation (``SLURM_JOB_NODELIST`` + tasks per node)."""
    var = next((v for v in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if environ.get(v)), None)
    if var is None:
        raise ConfigError("not inside a SLURM allocation: SLURM_JOB_NODELIST is not set (use --hostfile or -H)")
    names = expand_nodelist(environ[var], var)
    tasks_var = next((v for v in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if environ.get(v)), None)
    slots = expand_tasks_per_node(environ[tasks_var], len(names), tasks_var) if tasks_var else [1] * len(names)
    hosts = [Host(n, s) for n, s in zip(names, slots)]
    source = f"{var}={environ[var]}" + (f", {tasks_var}={environ[tasks_var]}" if tasks_var else "")
    _no_duplicates(hosts, lambda h: source)
    return HostList(tuple(hosts), source)


# ------------------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class Placement:
    """Ranks placed by slot: ``ranks_per_host`` lists the hosts that run at least one rank."""

    ranks_per_host: tuple[tuple[str, int], ...]
    source: str

    @property
    def np(self) -> int:
        return sum(n for _, n in self.ranks_per_host)

    @property
    def nodes(self) -> int:
        """Hosts in the job: Horovod's ``cross_size()`` for local rank 0."""
        return len(self.ranks_per_host)

    @property
    def local_sizes(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.ranks_per_host)

    @property
    def homogeneous(self) -> bool:
        return len(set(self.local_sizes)) == 1

    @property
    def root_host(self) -> str:
        """Where rank 0 runs."""
        return self.ranks_per_host[0][0]

    def describe(self) -> str:
        return ", ".join(f"{h}:{n}" for h, n in self.ranks_per_host)


def place(hosts: HostList, np: int | None = None) -> Placement:
    """Fill slots in host order with ``np`` ranks (default: every slot)."""
    total = hosts.total_slots
    np = total if np is None else np
    if np <= 0:
        raise ConfigError(f"-np must be positive, got {np}")
    if np > total:
        raise ConfigError(
            f"{hosts.source}: -np {np} is more than the {total} slot(s) it lists "
            f"({', '.join(f'{h.name}:{h.slots}' for h in hosts.hosts)})"
        )
    left, ranks = np, []
    for h in hosts.hosts:
        if left == 0:
            break
        n = min(h.slots, left)
        ranks.append((h.name, n))
        left -= n
    return Placement(tuple(ranks), hosts.source)


def nodes_of_size(size: int, local_size: int) -> int:
    """Number of nodes of a homogeneous job (at least 2 whenever ``local_size < size``)."""
    return max(1, math.ceil(size / max(local_size, 1)))


# ------------------------------------------------------------------------------------- policies

HIERARCHICAL_MODES = ("auto", "on", "off")


def mpi_as_fast_as_nccl(launcher: str | None, fabric: str | None, environ: Mapping[str, str]) -> tuple[bool, str]:
    """Whether MPI's transport across nodes is as fast as NCCL's, so Horovod's hierarchical allreduce (its
    cross-node step is ``MPI_Allreduce`` on host memory) can beat NCCL's flat allreduce; and why.

    The fabric model (docs/scaling.md) puts the hierarchical allreduce ahead only when its MPI step runs at
    the NIC's rate: on Ethernet (``--fabric eth`` or ``NCCL_IB_DISABLE=1``: NCCL uses TCP sockets too) or
    with Open MPI on UCX (``--launcher mpirun --fabric ib``, or ``OMPI_MCA_pml=ucx``). Under horovodrun,
    which forces ``-mca pml ob1`` (TCP, over IPoIB on InfiniBand), NCCL's own IB verbs win ~6x at 16 GPUs,
    and with an unknown fabric the flat allreduce is the safe choice."""
    if fabric == "eth" or environ.get("NCCL_IB_DISABLE") == "1":
        return True, "NCCL and MPI both use TCP"
    if launcher == "mpirun" and fabric == "ib":
        return True, "mpirun lets Open MPI use UCX (RDMA)"
    if environ.get("OMPI_MCA_pml") == "ucx":
        return True, "Open MPI on UCX (RDMA)"
    if launcher == "horovodrun":
        return False, "horovodrun runs MPI over TCP (pml ob1) while NCCL can use InfiniBand"
    return False, "MPI's transport across nodes unknown: NCCL's flat allreduce"


def hierarchical_allreduce(
    mode: str, nodes: int, controller: str | None, mpi_fast: tuple[bool, str] = (False, "")
) -> tuple[bool, str]:
    """Whether Horovod should run its hierarchical allreduce, and why.

    Horovod 0.28's hierarchical allreduce (NCCL reduce-scatter inside a node, ``MPI_Allreduce``
    across nodes on host memory, NCCL all-gather) is only registered with the MPI controller;
    under Gloo the setting is silently ignored. ``on`` with Gloo is therefore an error, and ``auto``
    turns it on when the job spans more than one node, the controller is (or can be) MPI and MPI's
    transport across nodes is as fast as NCCL's (``mpi_fast``, from ``mpi_as_fast_as_nccl``).
    ``controller`` is "mpi", "gloo" or None (not decided yet: the launcher will choose MPI).
    """
    if mode not in HIERARCHICAL_MODES:
        raise ConfigError(f"hierarchical allreduce must be one of {', '.join(HIERARCHICAL_MODES)}, got {mode!r}")
    if mode == "off":
        return False, "off"
    if controller == "gloo":
        if mode == "on":
            raise ConfigError(
                "hierarchical allreduce is on, but it needs the MPI controller (Horovod's "
                "hierarchical allreduce reduces across nodes with MPI) and this job uses Gloo: "
                "launch with --mpi / mpirun, or set it off"
            )
        return False, "auto: off under the Gloo controller"
    if mode == "on":
        return True, "on"
    if nodes == 1:
        return False, "auto: one node"
    fast, why = mpi_fast
    if fast:
        return True, f"auto: {nodes} nodes, {why}"
    return False, f"auto: {nodes} nodes; flat NCCL allreduce: {why or 'MPI transport unknown'}"


FABRICS = ("auto", "ib", "eth")


def nccl_presets(fabric: str, iface: str | None = None, ib_gid_index: int | None = None) -> dict[str, str]:
    """NCCL environment for a fabric.

    ib:   keep NCCL's InfiniBand transport (``NCCL_IB_DISABLE=0``); ``NCCL_IB_GID_INDEX`` only when
          given (RoCE needs it, usually 3 for RoCE v2; native InfiniBand does not).
    eth:  TCP sockets only (``NCCL_IB_DISABLE=1``), so NCCL never probes an RDMA device that the
          Ethernet path cannot use.
    auto: nothing; NCCL detects the transport itself.
    ``iface`` pins ``NCCL_SOCKET_IFNAME`` (the bootstrap interface, and the data interface on eth).
    No ``NCCL_ALGO`` is forced: NCCL's tuner already chooses ring or tree per message size and
    node count (tree across nodes), and forcing one removes the other where it wins. Set it through
    the config's ``distributed.nccl_algorithm`` once a measurement says so.
    """
    if fabric not in FABRICS:
        raise ConfigError(f"--fabric must be one of {', '.join(FABRICS)}, got {fabric!r}")
    env: dict[str, str] = {}
    if fabric == "ib":
        env["NCCL_IB_DISABLE"] = "0"
        if ib_gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(ib_gid_index)
    elif ib_gid_index is not None:
        raise ConfigError("--ib-gid-index applies to --fabric ib (RoCE) only")
    if fabric == "eth":
        env["NCCL_IB_DISABLE"] = "1"
    if iface:
        env["NCCL_SOCKET_IFNAME"] = iface
    return env


#: variables every rank needs to see as the launching shell sees them
PASSTHROUGH_PREFIXES = ("NCCL_", "HOROVOD_", "HVD_NGP_", "UCX_", "CUDA_", "TORCH_", "OMP_")
PASSTHROUGH_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED")


def passthrough_names(environ: Mapping[str, str]) -> list[str]:
    """Names of the launching environment's variables that ranks must inherit (user ``NCCL_*`` included)."""
    return sorted(k for k in environ if k in PASSTHROUGH_NAMES or k.startswith(PASSTHROUGH_PREFIXES))
