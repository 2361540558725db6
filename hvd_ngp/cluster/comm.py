"""How ranks communicate: Horovod's knobs, the config's ``distributed`` block, the learning-rate rule.

``CommSettings.from_flags`` validates the ``horovod`` option group (``CommFlags``) and the ``distributed`` JSON block
at parse time. ``init_env`` returns the variables Horovod and NCCL read inside ``hvd.init()``
(``dist.init`` sets them first); ``check_runtime`` compares what the launcher and the runtime
decided (ranks, nodes, controller) with what the config asked for and fails with an error that
names the config file.

Defaults (see README "Scaling out"):
- fusion threshold 128 MiB: the whole default gradient (a 2^19 x 16 x 2 hash grid, 64 MiB in fp32,
  plus the MLPs) fits one fused allreduce per step;
- cycle time 0.1 ms: measured on 2 H200s (docs/HOROVOD_BUILD.md), a 64 MiB allreduce took 2.12 ms
  with Horovod's default cycle time and 0.51 ms with 0.1 ms;
- learning rate x sqrt(m) for a batch m times larger (m = ranks x backward passes per step):
  Adam's square-root scaling rule (Malladi et al. 2022, "On the SDEs and scaling rules for adaptive
  gradient algorithms"); linear scaling (Goyal et al. 2017) is derived for SGD. With Adasum the
  reduction itself adapts the step; Horovod's Adasum guide scales by the GPUs per node instead.
"""

from __future__ import annotations

import argparse
import math
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError
from ..launcher_env import launcher_controller, launcher_sizes
from .topology import HIERARCHICAL_MODES, hierarchical_allreduce, mpi_as_fast_as_nccl, nodes_of_size

DEFAULT_FUSION_THRESHOLD_MB = 128.0
DEFAULT_CYCLE_TIME_MS = 0.1
COMPRESSIONS = ("none", "fp16")
REDUCE_OPS = ("average", "adasum")
LR_SCALINGS = ("auto", "none", "linear", "sqrt")
#: when gradients meet (docs/sync-modes.md): every step (Horovod's allreduce, waited for in the step), one step
#: late (the allreduce runs during the next step), or parameters averaged every --sync_period steps (local steps)
GRAD_SYNCS = ("every", "delayed", "delayed_grid", "periodic")
#: ``--delay_compensation``: none, or local (delayed_grid's forward runs on the anchor plus a speculative Adam step
#: from this rank's own grid gradient; docs/sync-modes.md)
DELAY_COMPENSATIONS = ("none", "local")
DEFAULT_SYNC_PERIOD = 8
#: NCCL_ALGO values NCCL 2.2x understands (case-insensitive)
NCCL_ALGORITHMS = ("ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
#: "distributed" block keys -> meaning (the seed guides' configs/nerf/hashgrid.json spelling)
TOPOLOGIES = ("auto", "single_node", "multi_node")
ALLREDUCE_ALGORITHMS = {"auto": "auto", "ring": "off", "hierarchical": "on"}


def add_options(parser: argparse.ArgumentParser) -> None:
    """The trainer's ``horovod`` option group (also read by the launcher and the benchmarks)."""
    g = parser.add_argument_group("horovod (communication; see README 'Scaling out')")
    g.add_argument(
        "--fusion_threshold_mb",
        type=float,
        default=None,
        help=f"Horovod tensor-fusion buffer in MiB (HOROVOD_FUSION_THRESHOLD); unset: the environment's "
        f"value if any, else {DEFAULT_FUSION_THRESHOLD_MB:g}",
    )
    g.add_argument(
        "--cycle_time_ms",
        type=float,
        default=None,
        help=f"Horovod cycle time in ms (HOROVOD_CYCLE_TIME); unset: the environment's value if any, "
        f"else {DEFAULT_CYCLE_TIME_MS:g}",
    )
    g.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        default="none",
        help="gradient compression for the allreduce; fp16 runs with dynamic loss scaling so small "
        "hash-grid gradients survive half precision (with --grad_sync delayed_grid: the late grid gradient "
        "travels as fp16, scaled by a power of two the ranks agree on; docs/sync-modes.md)",
    )
    g.add_argument(
        "--hierarchical_allreduce",
        choices=HIERARCHICAL_MODES,
        default="auto",
        help="Horovod hierarchical allreduce (NCCL inside a node, MPI across nodes; MPI controller only); "
        "auto: on when the job spans several nodes and MPI's transport across them is as fast as "
        "NCCL's (Ethernet, or Open MPI on UCX); else NCCL's flat allreduce (docs/scaling.md)",
    )
    g.add_argument(
        "--backward_passes_per_step",
        type=int,
        default=1,
        help="gradient accumulation: backward passes (each of --target_samples) per optimizer step",
    )
    g.add_argument(
        "--reduce_op",
        choices=REDUCE_OPS,
        default="average",
        help="how gradients are combined across ranks (adasum: MPI controller, power-of-2 ranks)",
    )
    g.add_argument(
        "--model_parallel",
        type=int,
        default=None,
        metavar="K",
        help="split the scene's hash grid by space over K ranks (hybrid data x model parallelism: "
        "ranks / K replicas of K regions; see README 'Model parallel'); unset: the config's "
        "distributed.model_parallel, else 1 (data parallelism only)",
    )
    g.add_argument(
        "--lr_scaling",
        choices=LR_SCALINGS,
        default="auto",
        help="learning rate for a batch m = ranks x backward passes larger than one rank's: "
        "auto (sqrt(m) with average, Adasum's rule with adasum), none, linear (x m), sqrt",
    )
    g.add_argument(
        "--grad_sync",
        choices=GRAD_SYNCS,
        default="every",
        help="every: average gradients every step; delayed: step t's allreduce runs during step t+1 and "
        "its average is applied one step late; delayed_grid: the MLPs' gradients every step, the hash grid's one step late (its allreduce, ~99%% of the bytes, runs during step t+1); periodic: each rank steps on its own gradient and "
        "parameters and Adam moments are averaged every --sync_period steps (docs/sync-modes.md)",
    )
    g.add_argument(
        "--sync_period",
        type=int,
        default=None,
        metavar="H",
        help="--grad_sync periodic: steps between parameter averages (default 8)",
    )
    g.add_argument(
        "--delay_compensation",
        choices=DELAY_COMPENSATIONS,
        default="none",
        help="--grad_sync delayed_grid: local = each rank's forward uses the shared grid parameters plus the Adam "
        "step its own late gradient would make (not committed; the average replaces it one step later); one more "
        "copy of the grid parameters (docs/sync-modes.md)",
    )


# ------------------------------------------------------------------------------------- "distributed" block


@dataclass(frozen=True)
class DistributedBlock:
    """The config's ``distributed`` block (the seed guides' keys), validated."""

    source: str
    enable: bool = True
    world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    nccl_topology_file: str | None = None
    nccl_algorithm: str | None = None
    topology: str = "auto"
    allreduce_algorithm: str = "auto"
    model_parallel: int = 1

    @staticmethod
    def parse(block: Mapping[str, Any] | None, source: str) -> "DistributedBlock":
        block = dict(block or {})
        known = [f for f in DistributedBlock.__dataclass_fields__ if f != "source"]
        unknown = sorted(set(block) - set(known))
        if unknown:
            raise ConfigError(
                f"{source}: unknown key(s) in 'distributed': {', '.join(unknown)} (known: {', '.join(known)})"
            )

        def bad(key: str, expected: str) -> ConfigError:
            return ConfigError(f"{source}: distributed.{key} must be {expected}, got {block[key]!r}")

        def auto_none(key: str) -> Any:
            value = block.get(key)
            return None if value in (None, "auto") else value

        enable = block.get("enable", True)
        if not isinstance(enable, bool):
            raise bad("enable", "true or false")
        world_size = auto_none("world_size")
        if world_size is not None and (
            isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0
        ):
            raise bad("world_size", 'a positive integer or "auto"')
        master_addr = auto_none("master_addr")
        if master_addr is not None and (not isinstance(master_addr, str) or not master_addr.strip()):
            raise bad("master_addr", "a host name or address")
        master_port = auto_none("master_port")
        if master_port is not None and (
            isinstance(master_port, bool) or not isinstance(master_port, int) or not 0 < master_port < 65536
        ):
            raise bad("master_port", "a port number (1-65535)")
        topo_file = auto_none("nccl_topology_file")
        if topo_file is not None and (not isinstance(topo_file, str) or not topo_file):
            raise bad("nccl_topology_file", "a file path")
        algo = auto_none("nccl_algorithm")
        if algo is not None:
            if not isinstance(algo, str) or not algo:
                raise bad("nccl_algorithm", f'"auto" or NCCL_ALGO values ({", ".join(NCCL_ALGORITHMS)})')
            for token in algo.lstrip("^").split(","):
                if token.strip().lower() not in NCCL_ALGORITHMS:
                    raise bad(
                        "nccl_algorithm", f'"auto" or comma-separated NCCL_ALGO values ({", ".join(NCCL_ALGORITHMS)})'
                    )
        topology = block.get("topology", "auto")
        if topology not in TOPOLOGIES:
            raise bad("topology", " | ".join(TOPOLOGIES))
        allreduce = block.get("allreduce_algorithm", "auto")
        if allreduce not in ALLREDUCE_ALGORITHMS:
            raise bad("allreduce_algorithm", " | ".join(ALLREDUCE_ALGORITHMS))
        model_parallel = block.get("model_parallel", 1)
        if isinstance(model_parallel, bool) or not isinstance(model_parallel, int) or model_parallel < 1:
            raise bad("model_parallel", "a positive integer (regions per replica)")
        return DistributedBlock(
            source, enable, world_size, master_addr, master_port, topo_file, algo, topology, allreduce, model_parallel
        )

    def check(self, world_size: int, nodes: int, controller: str | None, how: str) -> None:
        """What the launcher or runtime decided vs what the block asks for. ``how``: e.g. "horovodrun -np 4"."""
        where = f"{self.source}: distributed"
        if not self.enable and world_size > 1:
            raise ConfigError(f"{where}.enable is false but the job runs {world_size} ranks ({how})")
        if self.world_size is not None and self.world_size != world_size:
            raise ConfigError(f"{where}.world_size is {self.world_size} but the job runs {world_size} rank(s) ({how})")
        if self.topology == "single_node" and nodes > 1:
            raise ConfigError(f"{where}.topology is single_node but the job spans {nodes} nodes ({how})")
        if self.topology == "multi_node" and nodes < 2:
            raise ConfigError(f"{where}.topology is multi_node but the job runs on one node ({how})")
        if self.allreduce_algorithm == "hierarchical" and controller == "gloo":
            raise ConfigError(
                f"{where}.allreduce_algorithm is hierarchical, which needs the MPI controller, "
                f"but the job uses Gloo ({how})"
            )

    def nccl_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``NCCL_TOPO_FILE``/``NCCL_ALGO`` from the block; a different value already in the environment is an error."""
        env: dict[str, str] = {}
        if self.nccl_topology_file:
            env["NCCL_TOPO_FILE"] = str(Path(self.nccl_topology_file).expanduser().resolve())
        if self.nccl_algorithm:
            env["NCCL_ALGO"] = self.nccl_algorithm
        for key, value in env.items():
            if environ.get(key, value) != value:
                raise ConfigError(
                    f"{self.source}: distributed block sets {key}={value} but the environment has "
                    f"{key}={environ[key]}; remove one"
                )
        return env

    def check_host(self, is_root: bool) -> None:
        """Per-machine checks (run on every rank through ``dist.agree``): the NCCL topology file exists
        here, and rank 0 owns ``master_addr``."""
        if self.nccl_topology_file and not Path(self.nccl_topology_file).expanduser().is_file():
            raise ConfigError(
                f"{self.source}: distributed.nccl_topology_file {self.nccl_topology_file}: no such file "
                f"on {socket.gethostname()}"
            )
        if is_root and self.master_addr and not is_local_address(self.master_addr):
            raise ConfigError(
                f"{self.source}: distributed.master_addr is {self.master_addr!r} but rank 0 runs on "
                f"{socket.gethostname()!r}, which does not own that address"
            )


def is_local_address(name: str) -> bool:
    """True when ``name`` resolves to an address this machine can bind (so it is one of ours)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return False
    for family, _, _, _, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False


# ------------------------------------------------------------------------------------- knobs


def describe_allreduce(hierarchical: bool, use_cuda: bool) -> str:
    """How the gradients are reduced, in words, for logs and reports: Horovod's hierarchical allreduce (NCCL
    inside a node, MPI across) works on GPU tensors only, so on the CPU a request for it has no effect."""
    if not hierarchical:
        return "flat allreduce"
    if use_cuda:
        return "hierarchical allreduce"
    return "hierarchical allreduce requested; it has no effect on CPU tensors (Horovod's is NCCL + MPI)"


@dataclass(frozen=True)
class CommFlags:
    """The ``horovod`` option group as parsed (``add_options``), with the two other flags it is checked against:
    the merged network blocks (``model``: the ``distributed`` block and ``_source``) and ``--precision``."""

    fusion_threshold_mb: float | None
    cycle_time_ms: float | None
    compression: str
    hierarchical_allreduce: str
    backward_passes_per_step: int
    reduce_op: str
    model_parallel: int | None  # None: the distributed block's
    lr_scaling: str
    grad_sync: str
    sync_period: int | None  # None: DEFAULT_SYNC_PERIOD under --grad_sync periodic
    delay_compensation: str
    model: dict
    precision: str


@dataclass(frozen=True)
class CommSettings:
    """The ``horovod`` option group merged with the ``distributed`` block."""

    fusion_threshold_mb: float | None
    cycle_time_ms: float | None
    compression: str
    hierarchical: str  # auto | on | off (the flag, or the block's allreduce_algorithm)
    backward_passes_per_step: int
    reduce_op: str
    lr_scaling: str
    block: DistributedBlock
    model_parallel: int = 1  # K regions per replica (``--model_parallel`` or distributed.model_parallel)
    grad_sync: str = "every"  # every | delayed | delayed_grid | periodic (``--grad_sync``)
    sync_period: int = 1  # periodic: steps between parameter averages
    delay_compensation: str = "none"  # none | local (``--delay_compensation``; delayed_grid only)

    @staticmethod
    def from_flags(flags: CommFlags) -> "CommSettings":
        """Validate the flags against each other and the ``distributed`` block; raises ``ConfigError``."""
        source = flags.model.get("_source", "config")
        block = DistributedBlock.parse(flags.model.get("distributed"), source)
        for name in ("fusion_threshold_mb", "cycle_time_ms"):
            value = getattr(flags, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"--{name} must be >= 0, got {value}")
        if flags.backward_passes_per_step < 1:
            raise ConfigError(f"--backward_passes_per_step must be >= 1, got {flags.backward_passes_per_step}")
        if flags.reduce_op == "adasum" and flags.precision == "fp16":
            raise ConfigError(
                "--reduce_op adasum does not support --precision fp16 (Horovod's Adasum optimizer "
                "has no loss-scaling path); use fp32 or bf16"
            )
        hierarchical = flags.hierarchical_allreduce
        from_block = ALLREDUCE_ALGORITHMS[block.allreduce_algorithm]
        if hierarchical == "auto":
            hierarchical = from_block
        elif from_block != "auto" and from_block != hierarchical:
            raise ConfigError(
                f"{source}: distributed.allreduce_algorithm is {block.allreduce_algorithm} but "
                f"--hierarchical_allreduce is {hierarchical}; remove one"
            )
        k = flags.model_parallel
        if k is None:
            k = block.model_parallel
        elif k < 1:
            raise ConfigError(f"--model_parallel must be >= 1, got {k}")
        elif block.model_parallel not in (1, k):
            raise ConfigError(
                f"{source}: distributed.model_parallel is {block.model_parallel} but --model_parallel is "
                f"{k}; remove one"
            )
        if k > 1 and flags.compression == "fp16":
            raise ConfigError(
                f"--model_parallel {k} with --compression fp16: the fp16 loss scaler decides overflows "
                "per region group, so regions would skip different steps, and the segment exchange "
                "stays fp32; use --compression none"
            )
        if k > 1 and flags.reduce_op == "adasum":
            raise ConfigError(
                f"--model_parallel {k} with --reduce_op adasum: Adasum reduces over all ranks, not "
                "within a region's process set; use --reduce_op average"
            )
        mode = flags.grad_sync
        period = flags.sync_period
        if period is not None and mode != "periodic":
            raise ConfigError(f"--sync_period {period} needs --grad_sync periodic (it is {mode})")
        if period is not None and period < 1:
            raise ConfigError(f"--sync_period must be >= 1, got {period}")
        if flags.delay_compensation != "none" and mode != "delayed_grid":
            raise ConfigError(
                f"--delay_compensation {flags.delay_compensation} needs --grad_sync delayed_grid (it is {mode})"
            )
        if mode in ("delayed", "periodic") and flags.compression == "fp16":
            raise ConfigError(
                f"--grad_sync {mode} cannot run with --compression fp16; use --grad_sync delayed_grid (its grid "
                "gradient travels as scaled fp16) or --grad_sync every"
            )
        if mode != "every":
            refuse = [
                (k > 1, f"--model_parallel {k} (regions average inside process sets every step)"),
                (flags.precision == "fp16", "--precision fp16 (its gradient scaler reads every step's gradients)"),
                (flags.reduce_op == "adasum", "--reduce_op adasum (Adasum combines gradients, not averages)"),
            ]
            found = [why for bad, why in refuse if bad]
            if found:
                raise ConfigError(f"--grad_sync {mode} cannot run with {found[0]}; use --grad_sync every")
        return CommSettings(
            flags.fusion_threshold_mb,
            flags.cycle_time_ms,
            flags.compression,
            hierarchical,
            flags.backward_passes_per_step,
            flags.reduce_op,
            flags.lr_scaling,
            block,
            k,
            mode,
            period if period is not None else (DEFAULT_SYNC_PERIOD if mode == "periodic" else 1),
            flags.delay_compensation,
        )

    @property
    def loss_scaled_compression(self) -> bool:
        """fp16 compression of averaged gradients runs under a gradient scaler (see ``training.recipe.make_scaler``);
        ``delayed_grid``'s fp16 wire scales its own (``training.gradsync``) and needs none."""
        return self.compression == "fp16" and self.reduce_op == "average" and self.grad_sync == "every"

    def init_env(self, environ: Mapping[str, str], use_cuda: bool) -> dict[str, str]:
        """Variables to set before ``hvd.init()`` (Horovod and NCCL read them there)."""
        env = self.block.nccl_env(environ)
        elastic = environ.get("HOROVOD_ELASTIC") == "1"
        if elastic and self.grad_sync != "every":
            raise ConfigError(
                f"--grad_sync {self.grad_sync} cannot run elastic: the gradient in flight or the ranks' "
                "own parameters would be lost when the world is re-formed; use --grad_sync every"
            )
        if elastic and self.model_parallel > 1:
            raise ConfigError(
                f"--model_parallel {self.model_parallel} cannot run elastic: the regions are fixed "
                "process sets, and a world that changes size breaks the replica x region layout"
            )
        if elastic and (
            self.fusion_threshold_mb is not None
            or "HOROVOD_FUSION_THRESHOLD" in environ
            or environ.get("HOROVOD_AUTOTUNE") == "1"
        ):
            # Measured with Horovod 0.28.1 (Gloo, CPU): with HOROVOD_FUSION_THRESHOLD set, the surviving
            # rank segfaults inside hvd.init() when the elastic world is re-formed (autotune too:
            # horovod/horovod#2835). A clear error now beats a crash at the first host change.
            raise ConfigError(
                "elastic training: leave the tensor-fusion threshold to Horovod (no "
                "--fusion_threshold_mb, HOROVOD_FUSION_THRESHOLD or --autotune): Horovod 0.28.1 "
                "crashes when it re-forms the world with it set"
            )
        for key, value, default in (
            ("HOROVOD_FUSION_THRESHOLD", self.fusion_threshold_mb, DEFAULT_FUSION_THRESHOLD_MB),
            ("HOROVOD_CYCLE_TIME", self.cycle_time_ms, DEFAULT_CYCLE_TIME_MS),
        ):
            if value is None and (
                key in environ
                or environ.get("HOROVOD_AUTOTUNE") == "1"
                or (elastic and key == "HOROVOD_FUSION_THRESHOLD")
            ):
                continue  # e.g. horovodrun --cycle-time-ms; --autotune tunes what is not set; elastic: see above
            value = default if value is None else value
            env[key] = str(int(value * 1024 * 1024)) if key == "HOROVOD_FUSION_THRESHOLD" else f"{value:g}"
        key = "HOROVOD_HIERARCHICAL_ALLREDUCE"
        if self.hierarchical != "auto" or key not in environ:  # auto keeps a launcher's decision
            size, local_size = launcher_sizes(environ)
            on, _ = hierarchical_allreduce(
                self.hierarchical,
                nodes_of_size(size, local_size),
                launcher_controller(environ),
                mpi_as_fast_as_nccl(None, None, environ),
            )
            env[key] = "1" if on and use_cuda else "0"
        return env

    def check_runtime(
        self, size: int, local_size: int, controller: str, use_cuda: bool, environ: Mapping[str, str]
    ) -> list[str]:
        """Errors when the running job contradicts the settings (same result on every rank); returns notes."""
        nodes = nodes_of_size(size, local_size)
        how = f"{size} rank(s) on {nodes} node(s), {controller} controller"
        self.block.check(size, nodes, controller, how)
        notes = []
        hierarchical_on = environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE") == "1"
        if hierarchical_on:
            hierarchical_allreduce("on", nodes, controller)  # raises under Gloo
        if hierarchical_on and use_cuda:
            notes.append(f"{describe_allreduce(True, True)} on ({nodes} node(s))")
        elif (hierarchical_on or self.hierarchical == "on") and not use_cuda:
            notes.append(describe_allreduce(True, False))
        self.check_reduce_op(size, controller)
        return notes

    def check_reduce_op(self, size: int, controller: str | None) -> None:
        """Adasum in Horovod 0.28 runs on the MPI controller only, with a power-of-2 number of ranks."""
        if self.reduce_op != "adasum" or size == 1:
            return
        if controller == "gloo":
            raise ConfigError("--reduce_op adasum needs the MPI controller; this job uses Gloo")
        if size & (size - 1):
            raise ConfigError(f"--reduce_op adasum needs a power-of-2 number of ranks; this job runs {size}")

    def lr_multiplier(self, size: int, local_size: int, use_cuda: bool) -> float:
        """Factor on the configured learning rate for ``size`` ranks (see the module docstring). With
        ``model_parallel`` K the batch grows with the D = size / K replicas only. ``--grad_sync periodic``:
        each rank steps on its own gradient, so the batch is one rank's (m = backward passes). ``delayed_grid``
        under ``auto``: no scaling (at 2 CPU ranks sqrt(2) cost 3.5 dB against ``every``, 1.0 cost 0.5 dB)."""
        replicas = 1 if self.grad_sync == "periodic" else max(size // self.model_parallel, 1)
        m = replicas * self.backward_passes_per_step
        rule = self.lr_scaling
        if rule == "auto":
            if self.reduce_op == "adasum":
                return float(local_size) if use_cuda else 1.0
            rule = "none" if self.grad_sync == "delayed_grid" else "sqrt"
        return {"none": 1.0, "linear": float(m), "sqrt": math.sqrt(m)}[rule]

    def describe_sync(self) -> str:
        """The gradient-sync mode in words (log lines)."""
        if self.grad_sync == "delayed":
            return "gradients averaged one step late (the allreduce runs during the next step)"
        if self.grad_sync == "delayed_grid":
            wire = ", on an fp16 wire (scaled to a shared power of two)" if self.compression == "fp16" else ""
            comp = (
                "; each rank's forward on the shared grid plus its own speculative Adam step"
                if self.delay_compensation == "local"
                else ""
            )
            return (
                f"MLP gradients averaged every step, the hash grid's one step late (during the next step{wire}{comp})"
            )
        if self.grad_sync == "periodic":
            return f"local steps, parameters and Adam moments averaged every {self.sync_period} steps"
        return "gradients averaged every step"

    def summary(self, environ: Mapping[str, str], lr_multiplier: float) -> dict[str, Any]:
        """The effective settings (after ``hvd.init``: the environment holds what Horovod read)."""
        fusion = environ.get("HOROVOD_FUSION_THRESHOLD")
        cycle = environ.get("HOROVOD_CYCLE_TIME")
        return {
            "fusion_threshold_mb": int(fusion) / 2**20 if fusion else None,
            "cycle_time_ms": float(cycle) if cycle else None,
            "compression": self.compression,
            "hierarchical_allreduce": environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE") == "1",
            "backward_passes_per_step": self.backward_passes_per_step,
            "reduce_op": self.reduce_op,
            "model_parallel": self.model_parallel,
            "grad_sync": self.grad_sync,
            "sync_period": self.sync_period if self.grad_sync == "periodic" else None,
            "delay_compensation": self.delay_compensation,
            "lr_multiplier": lr_multiplier,
            "nccl_algo": environ.get("NCCL_ALGO"),
            "nccl_topo_file": environ.get("NCCL_TOPO_FILE"),
        }

    def describe(self, environ: Mapping[str, str], lr_multiplier: float, nodes: int, notes: list[str]) -> str:
        """One log line: where the ranks run and what the allreduce will do."""
        s = self.summary(environ, lr_multiplier)
        parts = [
            f"{nodes} node(s)",
            f"fusion {s['fusion_threshold_mb']:g} MiB" if s["fusion_threshold_mb"] is not None else "fusion default",
            f"cycle {s['cycle_time_ms']:g} ms" if s["cycle_time_ms"] is not None else "cycle default",
            f"compression {self.compression}",
            self.reduce_op,
            f"{self.backward_passes_per_step} backward pass(es)/step",
            *([self.describe_sync()] if self.grad_sync != "every" else []),
            f"lr x{lr_multiplier:.3g}",
            *(f"{k}={environ[k]}" for k in ("NCCL_ALGO", "NCCL_TOPO_FILE") if environ.get(k)),
            *notes,
        ]
        return "communication: " + ", ".join(parts)
