"""A model of the gradient exchange: projected exposed communication per step on a described fabric.

Pure Python (no torch, no Horovod), so the projection is cheap to run and test anywhere. The formulae
are the alpha-beta ("Hockney") costs of the ring collectives (docs/scaling.md writes them out once):

    ring allreduce of S bytes over n ranks:       2 (n - 1) * alpha + 2 (n - 1) / n * S / B
    ring reduce-scatter or all-gather over n:       (n - 1) * alpha +   (n - 1) / n * S / B

with B the bandwidth of the slowest link every ring step crosses and alpha its per-step latency.
Across M nodes of G GPUs a flat ring's every step crosses a node NIC, so B is the NIC's bandwidth per
node and each NIC carries 2 (n - 1) / n * S in each direction. The hierarchical allreduce
(reduce-scatter inside each node, G concurrent allreduces of S / G across the nodes sharing the NIC,
all-gather inside) puts 2 (M - 1) / M * S through each NIC, but in Horovod the middle step is
``MPI_Allreduce`` on host memory: a device-to-host and a host-to-device copy of S / G, and MPI's own
transport (TCP under horovodrun, which forces ``-mca pml ob1``; RDMA only under mpirun + UCX).

Every number this module returns is a projection, not a measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from ..errors import ConfigError

MIB = 1 << 20
#: the MLPs' gradient bytes with configs/nerf/base.json (density 12288 + colour 83456; ``bench throughput``'s
#: gradient_bytes): what ``delayed_grid`` still waits for every step
DEFAULT_MLP_BYTES = 12288 + 83456
#: the float32 tail of ``delayed_grid``'s waited allreduce: the non-finite guard's two flags (loss, stop)
FRESH_TAIL_BYTES = 2 * 4
#: one more tail float under ``delayed_grid+fp16``: each rank's max |grid gradient|, the fp16 wire's scale bound
FP16_BOUND_BYTES = 4
GB = 1e9


@dataclass(frozen=True)
class Link:
    """One kind of link: bandwidth in GB/s per direction as a collective achieves it, latency per ring step in us."""

    name: str
    gbs: float
    alpha_us: float
    source: str


@dataclass(frozen=True)
class Fabric:
    """A cluster's links: ``intra`` between the GPUs of a node, ``inter`` (the NIC of each node, NCCL's transport),
    ``mpi`` (what Horovod's MPI_Allreduce achieves across nodes: TCP under horovodrun), ``host_copy_gbs``
    (device <-> host copies the hierarchical allreduce makes)."""

    name: str
    intra: Link
    inter: Link
    mpi_tcp: Link
    mpi_rdma: Link
    host_copy_gbs: float
    gpus_per_node: int
    nodes: int


# ------------------------------------------------------------------------------------- presets (sources: docs/scaling.md)

#: inside one node. NVLink 4 (H100/H200 SXM): 900 GB/s total per GPU = 450 GB/s per direction (NVIDIA data sheets);
#: NCCL's all_reduce_perf reaches ~360 GB/s bus bandwidth on 8 GPUs (80% of it). RTX 4090: PCIe 4.0 x16
#: (31.5 GB/s per direction, PCI-SIG) and no peer-to-peer, so NCCL stages every transfer through host
#: memory (SHM transport): two copies, ~12 GB/s.
NODES: dict[str, tuple[Link, int, float]] = {
    "h100-nvlink": (
        Link("NVLink 4 (H100 SXM)", 360.0, 3.0, "NVIDIA H100 data sheet: 900 GB/s per GPU; 80% as NCCL bus bandwidth"),
        8,
        50.0,
    ),
    "h200-nvlink": (
        Link("NVLink 4 (H200 SXM)", 360.0, 3.0, "NVIDIA H200 data sheet: 900 GB/s per GPU; 80% as NCCL bus bandwidth"),
        8,
        50.0,
    ),
    "rtx4090-pcie": (
        Link(
            "PCIe 4.0 x16 via host memory (no P2P)",
            12.0,
            10.0,
            "PCI-SIG PCIe 4.0 x16: 31.5 GB/s; no P2P on GeForce 40: two copies through host memory",
        ),
        8,
        25.0,
    ),
}

#: between nodes, per node NIC: (NCCL's transport, MPI over TCP on the same port, MPI over RDMA (UCX)).
#: InfiniBand HDR 200 Gb/s = 25 GB/s and NDR 400 Gb/s = 50 GB/s (NVIDIA ConnectX-6/-7 data sheets), NCCL's
#: IB verbs transport reaching ~90% of it; TCP over IPoIB ~25 Gb/s per connection (an assumption, see
#: docs/scaling.md). Ethernet 10/100 Gb/s (IEEE 802.3): TCP goodput 94% of line rate at MTU 1500
#: (1448 payload bytes per 1538 on the wire); 100 Gb/s TCP with a few streams ~60% of line rate.
NETS: dict[str, tuple[Link, Link, Link]] = {
    "ib200": (
        Link("InfiniBand HDR 200 Gb/s (NCCL IB verbs)", 22.5, 5.0, "ConnectX-6 HDR: 200 Gb/s; 90% for NCCL"),
        Link("MPI over TCP on IPoIB", 3.1, 30.0, "IPoIB TCP, ~25 Gb/s per connection (assumed)"),
        Link("MPI over UCX (RDMA)", 22.5, 5.0, "ConnectX-6 HDR: 200 Gb/s; 90%"),
    ),
    "ib400": (
        Link("InfiniBand NDR 400 Gb/s (NCCL IB verbs)", 45.0, 5.0, "ConnectX-7 NDR: 400 Gb/s; 90% for NCCL"),
        Link("MPI over TCP on IPoIB", 3.1, 30.0, "IPoIB TCP, ~25 Gb/s per connection (assumed)"),
        Link("MPI over UCX (RDMA)", 45.0, 5.0, "ConnectX-7 NDR: 400 Gb/s; 90%"),
    ),
    "eth10": (
        Link("Ethernet 10 Gb/s (NCCL sockets)", 1.175, 30.0, "IEEE 802.3 10GBASE: 1.25 GB/s; 94% TCP goodput"),
        Link("MPI over TCP", 1.175, 30.0, "IEEE 802.3 10GBASE: 1.25 GB/s; 94% TCP goodput"),
        Link("MPI over TCP (no RDMA on plain Ethernet)", 1.175, 30.0, "as TCP"),
    ),
    "eth100": (
        Link("Ethernet 100 Gb/s (NCCL sockets)", 7.5, 20.0, "IEEE 802.3 100GBASE: 12.5 GB/s; ~60% for TCP"),
        Link("MPI over TCP", 7.5, 20.0, "IEEE 802.3 100GBASE: 12.5 GB/s; ~60% for TCP"),
        Link("MPI over TCP (no RoCE assumed)", 7.5, 20.0, "as TCP"),
    ),
}

#: named clusters: (node preset, net preset or None for one node, nodes, GPUs per node)
CLUSTERS: dict[str, tuple[str, str | None, int, int]] = {
    "ib4": ("h100-nvlink", "ib200", 4, 4),  # hostfiles/ib4: 4 nodes x 4 GPUs, 200 Gb/s per node
    "eth2x2": ("h100-nvlink", "eth10", 2, 2),  # the seed guides' entry cluster: 10 Gb/s Ethernet
}

PRESETS = tuple(NODES) + tuple(NETS) + tuple(CLUSTERS)


def fabric(preset: str, nodes: int | None = None, gpus_per_node: int | None = None, node: str | None = None) -> Fabric:
    """A fabric from a node preset (one node), a network preset (``node`` inside each node, default
    h100-nvlink) or a named cluster; ``nodes``/``gpus_per_node`` override the preset's shape."""
    if preset in CLUSTERS:
        node_name, net_name, n_nodes, gpn = CLUSTERS[preset]
        node = node or node_name
    elif preset in NODES:
        node, net_name, n_nodes, gpn = node or preset, None, 1, NODES[preset][1]
    elif preset in NETS:
        node, net_name, n_nodes, gpn = node or "h100-nvlink", preset, 2, 8
    else:
        raise ConfigError(f"unknown fabric preset {preset!r} (known: {', '.join(PRESETS)})")
    if node not in NODES:
        raise ConfigError(f"unknown node preset {node!r} (known: {', '.join(NODES)})")
    intra, default_gpn, copy_gbs = NODES[node]
    n_nodes = nodes if nodes is not None else n_nodes
    gpn = gpus_per_node if gpus_per_node is not None else (gpn if preset in CLUSTERS else default_gpn)
    if n_nodes < 1 or gpn < 1:
        raise ConfigError(f"fabric {preset}: --nodes and --gpus_per_node must be >= 1, got {n_nodes} and {gpn}")
    if net_name is None:
        if n_nodes > 1:
            raise ConfigError(
                f"fabric {preset} is one node; for {n_nodes} nodes name a network preset "
                f"({', '.join(NETS)}) with --node {node}"
            )
        nic = Link("(one node)", math.inf, 0.0, "")
        inter = mpi_tcp = mpi_rdma = nic
    else:
        inter, mpi_tcp, mpi_rdma = NETS[net_name]
    name = preset if net_name is None or preset in CLUSTERS else f"{node}+{net_name}"
    return Fabric(name, intra, inter, mpi_tcp, mpi_rdma, copy_gbs, gpn, n_nodes)


# ------------------------------------------------------------------------------------- collectives


def ring_allreduce_s(n: int, n_bytes: float, link: Link) -> float:
    """Seconds for a ring allreduce of ``n_bytes`` over ``n`` ranks whose slowest link is ``link``."""
    if n <= 1 or n_bytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.alpha_us * 1e-6 + 2 * (n - 1) / n * n_bytes / (link.gbs * GB)


def ring_half_s(n: int, n_bytes: float, link: Link) -> float:
    """Seconds for a ring reduce-scatter (or all-gather) of ``n_bytes`` over ``n`` ranks."""
    if n <= 1 or n_bytes <= 0:
        return 0.0
    return (n - 1) * link.alpha_us * 1e-6 + (n - 1) / n * n_bytes / (link.gbs * GB)


def placement(ranks: int, f: Fabric) -> tuple[int, int]:
    """(nodes used, GPUs per node used) for ``ranks`` filling nodes in order, like the launchers."""
    per_node = min(ranks, f.gpus_per_node)
    nodes = -(-ranks // f.gpus_per_node)
    if nodes > f.nodes:
        raise ConfigError(f"{ranks} ranks do not fit fabric {f.name} ({f.nodes} node(s) x {f.gpus_per_node} GPUs)")
    return nodes, per_node


def flat_allreduce_s(ranks: int, n_bytes: float, f: Fabric) -> float:
    """NCCL's flat ring over all ranks: inside one node the GPU link, across nodes the node NIC bounds every step."""
    nodes, _ = placement(ranks, f)
    if nodes == 1:
        return ring_allreduce_s(ranks, n_bytes, f.intra)
    slow = f.inter if f.inter.gbs < f.intra.gbs else f.intra
    step_alpha = max(f.inter.alpha_us, f.intra.alpha_us)
    return ring_allreduce_s(ranks, n_bytes, replace(slow, alpha_us=step_alpha))


def hierarchical_allreduce_s(ranks: int, n_bytes: float, f: Fabric, mpi: str = "tcp") -> float:
    """Horovod's hierarchical allreduce: NCCL reduce-scatter in the node, MPI_Allreduce of S / G on host memory
    across nodes (G of them at once sharing the NIC), NCCL all-gather; ``mpi``: tcp (horovodrun) or rdma (UCX)."""
    nodes, g = placement(ranks, f)
    inside = 2 * ring_half_s(g, n_bytes, f.intra)
    if nodes == 1:
        return inside
    link = f.mpi_tcp if mpi == "tcp" else f.mpi_rdma
    shard = n_bytes / g
    copies = 2 * shard / (f.host_copy_gbs * GB)
    # G concurrent allreduces of S/G share one NIC: as one allreduce of S at the NIC's rate
    across = 2 * (nodes - 1) * link.alpha_us * 1e-6 + 2 * (nodes - 1) / nodes * shard * g / (link.gbs * GB)
    return inside + copies + across


# ------------------------------------------------------------------------------------- modes


@dataclass(frozen=True)
class Mode:
    """How the gradient exchange runs: the algorithm, its bytes, how often, and whether it overlaps compute.

    ``spec`` is a '+'-joined list such as ``flat``, ``hierarchical``, ``fp16``, ``accum4``, ``delayed``,
    ``delayed_grid``, ``periodic8``, ``delayed_grid+fp16``, ``hierarchical-rdma``. ``delayed_grid+fp16`` is the
    trainer's ``--grad_sync delayed_grid --compression fp16`` (only the grid's part halved); other combinations
    such as ``delayed+fp16`` are what-ifs the trainer refuses. ``+comp`` (``delayed_grid+comp``,
    ``delayed_grid+fp16+comp``: ``--delay_compensation local``) sends exactly what ``delayed_grid`` sends, so it
    is priced the same: its speculative Adam pass over the grid is compute, in the measured step time, not
    communication."""

    spec: str
    hierarchical: str | None = None  # None: flat; "tcp" or "rdma": MPI's transport across nodes
    fp16: bool = False
    accumulate: int = 1  # backward passes per allreduce
    period: int = 1  # steps per parameter average
    delayed: bool = False  # step t's allreduce overlaps step t+1's compute
    delayed_grid: bool = False  # only the hash grid's part overlaps; the MLPs' (``fresh_bytes``) is waited for
    compensated: bool = False  # delayed_grid's delay compensation: the same bytes and overlap

    @staticmethod
    def parse(spec: str) -> "Mode":
        kw: dict = {}
        for part in spec.strip().lower().split("+"):
            if part in ("flat", "ring", ""):
                continue
            if part in ("hierarchical", "hierarchical-tcp"):
                kw["hierarchical"] = "tcp"
            elif part == "hierarchical-rdma":
                kw["hierarchical"] = "rdma"
            elif part == "fp16":
                kw["fp16"] = True
            elif part == "delayed":
                kw["delayed"] = True
            elif part in ("delayed_grid", "delayedgrid"):
                kw["delayed_grid"] = True
            elif part == "comp":
                kw["compensated"] = True
            elif part.startswith("accum") and part[5:].isdigit() and int(part[5:]) >= 1:
                kw["accumulate"] = int(part[5:])
            elif part.startswith("periodic") and part[8:].isdigit() and int(part[8:]) >= 1:
                kw["period"] = int(part[8:])
            else:
                raise ConfigError(
                    f"unknown mode part {part!r} in {spec!r} (flat, hierarchical, hierarchical-rdma, "
                    f"fp16, accumK, delayed, delayed_grid, comp, periodicH, joined by '+')"
                )
        if kw.get("compensated") and not kw.get("delayed_grid"):
            raise ConfigError(f"mode {spec!r}: comp (delay compensation) needs delayed_grid")
        return Mode(spec, **kw)

    @property
    def sync(self) -> str:
        """The trainer's gradient sync this mode runs, named as ``sync_of`` names a run's: what its optimizer
        steps do (so whose measured steps-to-PSNR it needs). The algorithm, the wire of ``every`` and
        accumulation (its K is the runs' K) move the same averages, so those modes are ``every``."""
        if self.delayed_grid:
            return "delayed_grid" + ("+fp16" if self.fp16 else "") + ("+comp" if self.compensated else "")
        if self.delayed:
            return "delayed"
        if self.period > 1:
            return f"periodic{self.period}"
        return "every"


def sync_of(communication: Mapping[str, Any]) -> str:
    """A training run's gradient sync from its metrics' ``communication`` block (``CommSettings.summary``):
    ``every``, ``delayed``, ``delayed_grid[+fp16][+comp]`` or ``periodicH``, as ``Mode.sync`` names them."""
    sync = str(communication.get("grad_sync") or "every")
    if sync == "delayed_grid":
        fp16 = communication.get("compression") == "fp16"
        comp = communication.get("delay_compensation") == "local"
        return sync + ("+fp16" if fp16 else "") + ("+comp" if comp else "")
    if sync == "periodic":
        return f"periodic{communication.get('sync_period')}"
    return sync


def allreduce_ms(ranks: int, n_bytes: float, f: Fabric, mode: Mode) -> float:
    """One allreduce of ``n_bytes`` (before fp16 halving) the way ``mode`` runs it, in ms."""
    n_bytes = n_bytes / 2 if mode.fp16 else n_bytes
    if mode.hierarchical:
        return hierarchical_allreduce_s(ranks, n_bytes, f, mode.hierarchical) * 1e3
    return flat_allreduce_s(ranks, n_bytes, f) * 1e3


#: what one ``--grad_sync periodic`` sync averages, in gradient sizes: the parameters, Adam's two moments and the
#: parameter average (the ``Ema`` block of every shipped config; ``PeriodicAveraging.tensors``)
PERIODIC_COPIES = 4


def exposed_comm_ms(
    step_ms: float, grad_bytes: float, ranks: int, f: Fabric, mode: Mode, fresh_bytes: float = 0.0
) -> dict:
    """One projected row: ``comm_ms`` (one exchange), ``exposed_comm_ms`` (per backward pass, what the step
    waits for), ``efficiency`` = step / (step + exposed). ``step_ms``: one backward pass on one GPU.
    ``fresh_bytes``: the MLPs' part of ``grad_bytes`` (``delayed_grid`` waits for it every step, alone, before
    the grid's part starts)."""
    nodes, _ = placement(ranks, f)
    passes = mode.accumulate * mode.period  # backward passes per exchange
    # a periodic sync averages parameters, Adam's two moments and the parameter average, not one gradient
    copies = PERIODIC_COPIES if mode.period > 1 else 1
    grad_bytes, fresh_bytes = grad_bytes * copies, fresh_bytes * copies
    if mode.delayed_grid:
        # as --grad_sync delayed_grid [--compression fp16] runs: the MLPs' part and its tail in float32 (fp16
        # or not), waited for; then the grid's part, in float16 under fp16, overlapped with the next step
        fresh = min(max(fresh_bytes, 0.0), grad_bytes)
        tail = FRESH_TAIL_BYTES + (FP16_BOUND_BYTES if mode.fp16 else 0)
        waited = replace(mode, fp16=False)
        fresh_ms = allreduce_ms(ranks, fresh + tail, f, waited) if fresh > 0 and ranks > 1 else 0.0
        late_ms = allreduce_ms(ranks, grad_bytes - fresh, f, mode)
        comm_ms = fresh_ms + late_ms
        exposed = (fresh_ms + max(0.0, late_ms - step_ms * passes)) / passes
    elif mode.delayed:
        # the exchange overlaps the next optimizer step's compute (all its backward passes)
        comm_ms = allreduce_ms(ranks, grad_bytes, f, mode)
        exposed = max(0.0, comm_ms - step_ms * passes) / passes
    else:
        comm_ms = allreduce_ms(ranks, grad_bytes, f, mode)
        exposed = comm_ms / passes
    return {
        "ranks": ranks,
        "nodes": nodes,
        "mode": mode.spec,
        "fabric": f.name,
        "comm_ms": comm_ms,
        "exposed_comm_ms": exposed,
        "efficiency": step_ms / (step_ms + exposed),
        "projected": True,
    }


def project(
    step_ms: float,
    grad_bytes: float,
    ranks: Iterable[int],
    f: Fabric,
    modes: Sequence[Mode],
    fresh_bytes: float = DEFAULT_MLP_BYTES,
) -> list[dict]:
    """Rows for every (ranks, mode); ranks beyond the fabric's size are an error."""
    if not (step_ms > 0 and math.isfinite(step_ms)):
        raise ConfigError(f"step time must be > 0 ms, got {step_ms}")
    if not (grad_bytes > 0 and math.isfinite(grad_bytes)):
        raise ConfigError(f"gradient size must be > 0, got {grad_bytes} bytes")
    return [exposed_comm_ms(step_ms, grad_bytes, n, f, m, fresh_bytes) for n in ranks for m in modes]


# ------------------------------------------------------------------------------------- time to quality


def time_to_quality(
    steps: Mapping,
    grad_bytes: float,
    f: Fabric,
    psnr: str,
    mode: Mode,
    source: str = "steps JSON",
    fresh_bytes: float = 0.0,
) -> list[dict]:
    """Projected time-to-``psnr`` dB at N = K ranks from one-GPU runs with K backward passes per step.

    ``steps``: the steps-to-PSNR JSON (``step_ms_per_backward_pass``; ``runs``: k, seed, steps_to_psnr{psnr:
    int|null}). N ranks averaging gradients take the optimizer steps one GPU takes with K = N passes, each
    costing one pass (``step_ms_per_backward_pass``) plus the exposed exchange for N ranks on ``f``. Rows, one
    per K that fits the fabric: {ranks, seeds, steps (mean over seeds; None when a seed never reached it),
    step_ms, time_s, speedup (time at N = 1 / time at N), scaling (steps(1) / (N steps(N)): 1 while steps fall
    as 1/N), steps_of (whose steps: ``mode.sync`` where runs with that ``sync`` exist at this K, else
    ``every``, the mode's own quality cost then not counted)}. A run without ``sync`` is an ``every`` run; the
    N = 1 reference is always ``every``'s."""
    try:
        pass_ms = float(steps["step_ms_per_backward_pass"])
        runs = list(steps["runs"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: needs 'step_ms_per_backward_pass' and a 'runs' list ({exc})") from None
    if not pass_ms > 0:
        raise ConfigError(f"{source}: step_ms_per_backward_pass must be > 0, got {pass_ms}")
    by_k: dict[tuple[str, int], list] = {}  # (sync, K) -> steps per seed
    for i, run in enumerate(runs):
        try:
            k = int(run["k"])
            value = run["steps_to_psnr"][psnr]
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{source}: runs[{i}] needs 'k' and 'steps_to_psnr' with key {psnr!r}") from None
        if k < 1 or (value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0)):
            raise ConfigError(f"{source}: runs[{i}]: k must be >= 1 and steps_to_psnr[{psnr!r}] an integer or null")
        by_k.setdefault((str(run.get("sync", "every")), k), []).append(value)
    if ("every", 1) not in by_k:
        raise ConfigError(f"{source}: no run with k = 1 and sync every (the N = 1 reference)")
    rows: list[dict[str, Any]] = []
    for k in sorted({k for _, k in by_k}):
        if k > f.nodes * f.gpus_per_node:
            continue
        own = k > 1 and (mode.sync, k) in by_k
        steps_of = mode.sync if own else "every"
        if (steps_of, k) not in by_k:
            continue
        values = by_k[(steps_of, k)]
        mean = None if any(v is None for v in values) else sum(values) / len(values)
        exposed = exposed_comm_ms(pass_ms, grad_bytes, k, f, mode, fresh_bytes)["exposed_comm_ms"] if k > 1 else 0.0
        step_ms = pass_ms + exposed
        rows.append(
            {
                "ranks": k,
                "seeds": len(values),
                "steps": mean,
                "steps_of": steps_of,
                "step_ms": step_ms,
                "exposed_comm_ms": exposed,
                "time_s": None if mean is None else mean * step_ms / 1e3,
                "projected": True,
            }
        )
    base = rows[0]
    for r in rows:
        ok = r["steps"] is not None and base["steps"] is not None and r["steps"] > 0
        r["speedup"] = base["time_s"] / r["time_s"] if ok else None
        r["scaling"] = base["steps"] / (r["ranks"] * r["steps"]) if ok else None
    return rows


#: below this share of the ideal 1/N fall in steps, a larger batch has stopped paying for itself
CRITICAL_SCALING = 0.5


def critical_batch(rows: Sequence[dict]) -> dict:
    """Where a larger batch stops helping: ``ranks`` = the largest N whose steps still fall by at least
    CRITICAL_SCALING of 1/N (None if even the second N misses), ``fastest`` = the N with the shortest
    projected time (None without any)."""
    good = [r["ranks"] for r in rows if r["scaling"] is not None and r["scaling"] >= CRITICAL_SCALING]
    timed = [r for r in rows if r["time_s"] is not None]
    return {
        "ranks": max(good) if good else None,
        "fastest": min(timed, key=lambda r: r["time_s"])["ranks"] if timed else None,
    }


# ------------------------------------------------------------------------------------- emulated links (CPU, tc)

#: TCP payload per byte tc counts on a link that carries a ring's data one way and the ACKs of the opposite
#: flow: 1448 payload bytes per 1514-byte frame (MTU 1500, TCP timestamps), plus a 66-byte ACK frame per two
#: segments of the reverse flow (delayed ACKs) sharing the same uplink.
TCP_GOODPUT = 1448 / (1514 + 66 / 2)

#: seconds of latency per ring step of Horovod's CPU allreduce on the emulated links (``fit_alpha``), fitted to
#: 24 calibration rows (2 and 4 hosts, 1-16 MiB, 100 Mbit/s, 2026-12-06) with the bandwidth term fixed by the
#: set rate; docs/BENCHMARKS.md ("emulated links") checks them on a later run (``bench links`` prints the
#: refit too). Gloo writes straight into the peer's posted buffer; Open MPI's TCP transport adds a rendezvous
#: round trip per large message, which waits behind the data queued at the shaped link.
EMULATED_ALPHA_S = {"gloo": 0.0035, "mpi": 0.011}


def parse_rate_bps(text: str) -> float:
    """``1gbit``, ``100mbit`` -> bits per second (tc's spelling)."""
    t = text.strip().lower()
    for suffix, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if t.endswith(suffix):
            try:
                return float(t[: -len(suffix)]) * scale
            except ValueError:
                break
    raise ConfigError(f"link rate must look like 1gbit or 100mbit, got {text!r}")


def emulated_bandwidth_s(n_bytes: float, ranks: int, rate_bps: float) -> float:
    """The bandwidth term of a ring allreduce on links shaped to ``rate_bps``: 2 (n - 1) / n * S at TCP goodput."""
    return ring_allreduce_s(ranks, n_bytes, Link("tc-shaped veth", rate_bps / 8 * TCP_GOODPUT / GB, 0.0, "tc rate"))


def emulated_allreduce_s(
    n_bytes: float, ranks: int, rate_bps: float, controller: str, alpha_s: Mapping[str, float] | None = None
) -> float:
    """Seconds for Horovod's allreduce of ``n_bytes`` of CPU tensors, one rank per simulated host, every host
    link shaped to ``rate_bps`` (``simhosts up --rate``): a ring, 2 (n - 1) steps of ``alpha_s[controller]``
    plus the bandwidth term at the link's TCP goodput."""
    alpha = (EMULATED_ALPHA_S if alpha_s is None else alpha_s)[controller]
    return 2 * (ranks - 1) * alpha + emulated_bandwidth_s(n_bytes, ranks, rate_bps)


def fit_alpha(rows: Sequence[Mapping]) -> dict[str, float]:
    """Latency per ring step for each controller, with the bandwidth term fixed by the rate, minimising the
    squared relative error (each row counts alike, whatever its size): rows {controller, hosts, bytes,
    rate_bps, measured_s} -> {controller: alpha (>= 0)}."""
    out = {}
    for c in sorted({r["controller"] for r in rows}):
        # (steps / measured, excess / measured): relative residual = excess/m - alpha * steps/m
        pairs = [
            (
                2 * (r["hosts"] - 1) / r["measured_s"],
                (r["measured_s"] - emulated_bandwidth_s(r["bytes"], r["hosts"], r["rate_bps"])) / r["measured_s"],
            )
            for r in rows
            if r["controller"] == c
        ]
        out[c] = max(0.0, sum(k * e for k, e in pairs) / sum(k * k for k, _ in pairs))
    return out


# ---------------------------------------------------------------------------------------- the launcher's note

#: the one-GPU step the launcher's projection starts from: base.json on lego, one H100 (docs/BENCHMARKS.md,
#: 2026-12-06: 3.04 ms per step, a 46.6 MiB gradient); other scenes and GPUs differ (``bench fabric``)
REFERENCE_STEP_MS = 3.04
REFERENCE_GRAD_BYTES = 46.6 * 2**20
#: the launcher's ``--fabric`` -> the network preset its projection assumes
LAUNCH_NETWORKS = {"ib": "ib200", "eth": "eth10", "auto": "ib200"}
#: below this projected efficiency the launcher's note names ``delayed_grid+fp16``'s projection beside the job's
SUGGEST_BELOW = 0.75


def job_mode(comm: Mapping[str, Any], hierarchical: str | None) -> Mode:
    """The fabric model's mode for a job: ``comm`` as ``CommSettings.summary`` holds it (``grad_sync``,
    ``compression``, ``backward_passes_per_step``, ``sync_period``, ``delay_compensation``) and
    ``hierarchical`` None (flat NCCL), ``tcp`` or ``rdma`` (MPI's transport for the cross-node step)."""
    parts = ["flat" if hierarchical is None else ("hierarchical" if hierarchical == "tcp" else "hierarchical-rdma")]
    parts += ["fp16"] if comm.get("compression") == "fp16" else []
    passes = int(comm.get("backward_passes_per_step") or 1)
    parts += [f"accum{passes}"] if passes > 1 else []
    sync = sync_of(comm)
    parts += [] if sync == "every" else [p for p in sync.split("+") if p != "fp16"]
    return Mode.parse("+".join(parts))


def launch_projection(ranks: int, nodes: int, gpus_per_node: int, network: str, mode: Mode) -> str:
    """One line for the launcher: the exchange ``mode`` exposes per step for ``ranks`` ranks on ``nodes`` H100
    nodes joined by the ``network`` preset (one node: NVLink), from the reference step; and, below
    SUGGEST_BELOW efficiency, what ``delayed_grid+fp16`` would expose; the line says it is projected."""
    f = fabric("h100-nvlink", gpus_per_node=ranks) if nodes == 1 else fabric(network, nodes, gpus_per_node)
    row = exposed_comm_ms(REFERENCE_STEP_MS, REFERENCE_GRAD_BYTES, ranks, f, mode, DEFAULT_MLP_BYTES)
    where = "one NVLink node" if nodes == 1 else f"{nodes} H100 nodes on {f.inter.name}"
    line = (
        f"exchange (projected by the fabric model, not measured, for {where} from lego's {REFERENCE_STEP_MS} ms H100 step and "
        f"{REFERENCE_GRAD_BYTES / 2**20:.1f} MiB gradient; `python -m hvd_ngp.bench fabric` for yours): {mode.spec} "
        f"exposes {row['exposed_comm_ms']:.2f} ms per step, {row['efficiency']:.0%} efficiency"
    )
    if row["efficiency"] < SUGGEST_BELOW and not (mode.delayed_grid and mode.fp16):
        alt = exposed_comm_ms(
            REFERENCE_STEP_MS, REFERENCE_GRAD_BYTES, ranks, f, Mode.parse("delayed_grid+fp16"), DEFAULT_MLP_BYTES
        )
        line += (
            f"; --grad_sync delayed_grid --compression fp16 would expose {alt['exposed_comm_ms']:.2f} ms "
            f"({alt['efficiency']:.0%}) at more steps to a PSNR (docs/sync-modes.md)"
        )
    return line
