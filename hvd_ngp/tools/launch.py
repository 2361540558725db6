"""``python -m hvd_ngp.launch`` (console script ``hvd-ngp-launch``): one command for any cluster.

    hvd-ngp-launch --hostfile hostfiles/ib4 --fabric ib -- --config configs/nerf/hashgrid.json --scene data/fox
    hvd-ngp-launch --slurm --launcher mpirun --dry-run -- --scene data/fox

Reads the hosts (hostfile, ``-H`` list or the SLURM allocation), places the ranks, checks the
trainer's options and the config's ``distributed`` block against that placement, picks the
controller (MPI when hierarchical allreduce needs it; across nodes that is on only where MPI's transport
is as fast as NCCL's, see ``cluster.topology.mpi_as_fast_as_nccl``), builds the exact ``horovodrun`` or
``mpirun`` command line and environment (NCCL fabric presets, the user's ``NCCL_*`` variables),
and prints it (``--dry-run``) or runs it as a child, forwarding stop signals so that the ranks stop
with a checkpoint (``supervise``; exit status 75 when they did). Arguments after ``--`` go to the
program (``python -m hvd_ngp.train`` by default).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from ..cluster import fabric_model
from ..cluster.comm import CommSettings, DistributedBlock
from ..cluster.preempt import EXIT_PREEMPTED, MARKER, SUPERVISED_ENV
from ..cluster.topology import (
    FABRICS,
    Host,
    HostList,
    Placement,
    hierarchical_allreduce,
    mpi_as_fast_as_nccl,
    nccl_presets,
    parse_host_arg,
    parse_hostfile,
    passthrough_names,
    place,
    slurm_hosts,
)
from ..config import BASE_CONFIG, parse_settings
from ..errors import ConfigError, run_cli
from ..options import options_from

TRAINER = "hvd_ngp.train"
LAUNCHERS = ("horovodrun", "mpirun")
CONTROLLERS = ("auto", "mpi", "gloo")


@dataclass
class LaunchPlan:
    """What will run: the command, the variables added for every rank, and why."""

    command: list[str]
    env: dict[str, str]
    placement: Placement
    notes: list[str] = field(default_factory=list)

    def shell_line(self) -> str:
        """The command as one line a shell can run (``VAR=value ... horovodrun ...``)."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(prefix + [shlex.quote(a) for a in self.command])

    def describe(self) -> str:
        lines = [
            f"# hvd_ngp launch: {self.placement.np} rank(s) on {self.placement.nodes} node(s) "
            f"[{self.placement.describe()}] from {self.placement.source}"
        ]
        lines += [f"# {note}" for note in self.notes]
        lines.append("# environment added for every rank:" if self.env else "# environment: unchanged")
        lines += [f"{k}={v}" for k, v in sorted(self.env.items())]
        lines += ["# command:", self.shell_line()]
        return "\n".join(lines)


@dataclass(frozen=True)
class LaunchOptions:
    """The launcher's own command line (``build_parser`` holds each option's help); the program's arguments
    follow ``--`` and are not in here."""

    hostfile: str | None
    hosts: str | None  # host:slots,host:slots,...
    slurm: bool
    np: int | None
    write_hostfile: str | None
    launcher: str
    controller: str
    fabric: str
    iface: str | None
    ib_gid_index: int | None
    env: list[str]  # KEY=VALUE
    ssh_port: int | None
    launcher_arg: list[str]
    module: str
    python: str
    dry_run: bool


def parse_options(argv: Sequence[str]) -> LaunchOptions:
    """The launcher's options (``argv`` without the program's arguments), parsed once."""
    return options_from(LaunchOptions, build_parser().parse_args(list(argv)))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd-ngp-launch",
        description="Build and run the horovodrun/mpirun command for hvd_ngp. Program arguments follow '--'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("where the ranks run")
    hosts = g.add_mutually_exclusive_group()
    hosts.add_argument("--hostfile", "-hostfile", metavar="FILE", help="lines 'host slots=N' (# comments allowed)")
    hosts.add_argument("-H", "--hosts", metavar="LIST", help="host:slots,host:slots,...")
    hosts.add_argument("--slurm", action="store_true", help="the hosts of the current SLURM allocation")
    g.add_argument(
        "-np",
        "--np",
        type=int,
        default=None,
        help="ranks (default: distributed.world_size of the config, else every slot; on one machine "
        "without hosts: the GPU count, or 1)",
    )
    g.add_argument("--write-hostfile", metavar="PATH", help="also write the hosts as a hostfile (e.g. from --slurm)")
    g = p.add_argument_group("how they are started")
    g.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="horovodrun",
        help="horovodrun, or Open MPI's mpirun (bare-metal clusters, UCX on InfiniBand)",
    )
    g.add_argument(
        "--controller",
        choices=CONTROLLERS,
        default="auto",
        help="Horovod controller (auto: MPI when hierarchical allreduce or Adasum needs it, else horovodrun's default)",
    )
    g.add_argument("--fabric", choices=FABRICS, default="auto", help="NCCL presets: ib (InfiniBand/RoCE) or eth (TCP)")
    g.add_argument("--iface", help="network interface for NCCL sockets and MPI/Gloo traffic, e.g. ib0 or eth1")
    g.add_argument("--ib-gid-index", type=int, default=None, help="NCCL_IB_GID_INDEX (RoCE: usually 3)")
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra variable for every rank")
    g.add_argument("--ssh-port", type=int, default=None, help="ssh port of the hosts")
    g.add_argument(
        "--launcher-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="argument passed to horovodrun/mpirun before the program (repeatable; use --launcher-arg=-x)",
    )
    g.add_argument("--module", default=TRAINER, help="Python module the ranks run (python -m MODULE)")
    g.add_argument("--python", default=sys.executable, help="Python interpreter on the hosts")
    g.add_argument("--dry-run", action="store_true", help="print the command and environment instead of running it")
    return p


def local_hosts(np: int | None) -> HostList:
    """This machine alone: ``np`` slots, else one per GPU (at least one)."""
    if np is None:
        import torch  # only here: the launcher itself needs no GPU stack

        np = max(torch.cuda.device_count(), 1)
    return HostList((Host("localhost", np),), "this machine")


def resolve_hosts(opts: LaunchOptions, environ: Mapping[str, str], world_size: int | None) -> HostList:
    if opts.hostfile:
        return parse_hostfile(opts.hostfile)
    if opts.hosts:
        return parse_host_arg(opts.hosts)
    if opts.slurm:
        return slurm_hosts(environ)
    return local_hosts(opts.np or world_size)


def same_host(a: str, b: str) -> bool:
    """Whether two names denote one machine: equal names or a shared resolved address."""
    if a.lower() == b.lower():
        return True

    def addresses(name: str) -> set[str | int]:  # an IP address is a str (typeshed allows other families' ints)
        try:
            return {info[4][0] for info in socket.getaddrinfo(name, None)}
        except socket.gaierror:
            return set()

    return bool(addresses(a) & addresses(b))


def parse_env_assignments(items: Sequence[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise ConfigError(f"--env expects KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def find_executable(name: str, dry_run: bool) -> str:
    """``name`` next to this Python (the venv), else on PATH; in a dry run a missing one is shown by name."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found:
        return found
    if dry_run:
        return name
    hint = "run scripts/setup.sh" if name == "horovodrun" else "install Open MPI or load your cluster's MPI module"
    raise ConfigError(f"{name} not found ({hint})")


def plan(
    opts: LaunchOptions, environ: Mapping[str, str], program_args: Sequence[str], comm: CommSettings | None
) -> LaunchPlan:
    """Everything ``main`` prints or runs; pure apart from name lookups (no process is started)."""
    block = comm.block if comm else DistributedBlock("(no config)")
    hosts = resolve_hosts(opts, environ, block.world_size)
    if opts.np is None and block.world_size and block.world_size > hosts.total_slots:
        raise ConfigError(
            f"{block.source}: distributed.world_size is {block.world_size} but {hosts.source} "
            f"lists {hosts.total_slots} slot(s)"
        )
    placement = place(hosts, opts.np or block.world_size)
    notes: list[str] = []

    controller = "mpi" if opts.launcher == "mpirun" else (None if opts.controller == "auto" else opts.controller)
    if opts.launcher == "mpirun" and opts.controller == "gloo":
        raise ConfigError("--launcher mpirun runs the MPI controller; use --launcher horovodrun for --controller gloo")
    mode = comm.hierarchical if comm else "auto"
    mpi_fast = mpi_as_fast_as_nccl(opts.launcher, opts.fabric, environ)
    needs_mpi = [
        what
        for what, needed in (
            ("hierarchical allreduce", mode == "on" or (mode == "auto" and placement.nodes > 1 and mpi_fast[0])),
            ("Adasum", comm is not None and comm.reduce_op == "adasum" and placement.np > 1),
        )
        if needed
    ]
    if controller is None and needs_mpi:
        controller = "mpi"
        notes.append(f"controller: mpi ({' and '.join(needs_mpi)} {'needs' if len(needs_mpi) == 1 else 'need'} it)")
    elif controller:
        notes.append(f"controller: {controller}")
    else:
        notes.append("controller: horovodrun's default (MPI when Horovod was built with it)")
    if comm is not None:
        comm.check_reduce_op(placement.np, controller)
    on, why = hierarchical_allreduce(mode, placement.nodes, controller, mpi_fast)
    notes.append(f"hierarchical allreduce: {'on' if on else 'off'} ({why})")
    if comm is not None and placement.np > 1:
        notes.append(exchange_note(placement, opts, comm, on))
    how = f"{opts.launcher} -np {placement.np} on {placement.nodes} node(s)"
    block.check(placement.np, placement.nodes, controller, how)
    if block.master_addr and not same_host(block.master_addr, placement.root_host):
        raise ConfigError(
            f"{block.source}: distributed.master_addr is {block.master_addr!r} but rank 0 runs on "
            f"{placement.root_host!r} (the first host of {placement.source})"
        )

    env = nccl_presets(opts.fabric, opts.iface, opts.ib_gid_index)
    for key in sorted(env):
        if key in environ and environ[key] != env[key]:
            notes.append(f"{key}={environ[key]} from your environment overrides the preset {env[key]}")
            del env[key]
    env.update(block.nccl_env(environ))
    env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1" if on else "0"
    env.update(parse_env_assignments(opts.env))

    program = [opts.python, "-m", opts.module, *program_args]
    if opts.launcher == "horovodrun":
        command = [
            find_executable("horovodrun", opts.dry_run),
            "-np",
            str(placement.np),
            "-H",
            ",".join(f"{h}:{n}" for h, n in placement.ranks_per_host),
        ]
        command += [f"--{controller}"] if controller else []
        command += ["--network-interfaces", opts.iface] if opts.iface else []
        command += ["-p", str(opts.ssh_port)] if opts.ssh_port else []
    else:
        command = [find_executable("mpirun", opts.dry_run)]
        command += ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        command += [
            "-np",
            str(placement.np),
            "-H",
            ",".join(f"{h}:{n}" for h, n in placement.ranks_per_host),
            "--bind-to",
            "none",
            "--map-by",
            "slot",
            "--tag-output",
        ]
        if opts.fabric == "eth":
            command += ["-mca", "pml", "ob1", "-mca", "btl", "tcp,self,vader"]
        if opts.iface:
            command += ["-mca", "btl_tcp_if_include", opts.iface, "-mca", "oob_tcp_if_include", opts.iface]
        if opts.ssh_port:
            command += ["-mca", "plm_rsh_args", f"-p {opts.ssh_port}"]
        for name in passthrough_names({**environ, **env}):
            command += ["-x", name]
    command += [*opts.launcher_arg, *program]
    return LaunchPlan(command, env, placement, notes)


def exchange_note(placement: Placement, opts: LaunchOptions, comm: CommSettings, hierarchical: bool) -> str:
    """The fabric model's projection of this job's gradient exchange (``fabric_model.launch_projection``); the
    network is ``--fabric``'s (auto: InfiniBand 200 Gb/s assumed, and said)."""
    network = fabric_model.LAUNCH_NETWORKS[opts.fabric]
    # the cross-node step of a hierarchical allreduce: MPI over TCP under horovodrun, else RDMA (or TCP on eth)
    via = None if not hierarchical else ("tcp" if opts.launcher == "horovodrun" or opts.fabric == "eth" else "rdma")
    mode = fabric_model.job_mode(comm.summary({}, 1.0), via)
    gpus = max(placement.local_sizes)
    note = fabric_model.launch_projection(placement.np, placement.nodes, gpus, network, mode)
    return note + (
        " [--fabric auto: InfiniBand 200 Gb/s assumed]" if opts.fabric == "auto" and placement.nodes > 1 else ""
    )


def split_program_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Launcher options before ``--``, program arguments after it."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    own, program_args = split_program_args(sys.argv[1:] if argv is None else argv)
    opts = parse_options(own)
    comm, trainer = None, None
    if opts.module == TRAINER:  # check the trainer's options here, before any rank starts
        trainer = parse_settings(program_args, default_config=BASE_CONFIG)
        comm = trainer.runtime.comm
    # the ranks exit 0 after a stop with a checkpoint, and this process 75 from their marker (preempt.SUPERVISED_ENV)
    environ = {**os.environ, SUPERVISED_ENV: "1"} if trainer else dict(os.environ)
    launch = plan(opts, environ, program_args, comm)
    if opts.write_hostfile:
        hosts = resolve_hosts(opts, os.environ, comm.block.world_size if comm else None)
        Path(opts.write_hostfile).write_text(hosts.hostfile_text())
    if opts.dry_run:
        print(launch.describe(), flush=True)
        return 0
    print(launch.describe(), file=sys.stderr, flush=True)
    marker = Path(trainer.output.out_dir) / MARKER if trainer else None
    return supervise(
        launch.command, {**environ, **launch.env}, marker, trainer.loop.stop_signals if trainer else ("USR1",)
    )


# ------------------------------------------------------------------------------------ supervision

#: what each launcher needs to hear so the ranks stop with a checkpoint (see README, "Stops on signals"):
#: Open MPI's mpirun forwards SIGUSR1/SIGUSR2 to every rank at once, but answers SIGTERM/SIGINT with
#: SIGCONT, SIGTERM after odls_base_sigkill_timeout (1 s) and SIGKILL after as long again; a bare
#: ``horovodrun --mpi`` is /bin/sh running mpirun (a signal ends the shell only); horovodrun's Gloo
#: driver answers SIGTERM with SIGTERM to the ranks and SIGKILL 5 s later, and dies of SIGUSR1.
MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun", "prterun")
FORWARDED = ("TERM", "INT", "USR1", "USR2", "HUP")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _is_rank(pid: int) -> bool:
    try:
        return b"\0HOROVOD_RANK=" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def stop_targets(root: int) -> tuple[str, list[int]]:
    """Where a stop request must go in the process tree under ``root`` (the launcher we started):
    ("mpirun", [its pid]) when an MPI launcher runs (it forwards SIGUSR1 to every rank on every node),
    else ("ranks", [the rank processes on this machine]) (horovodrun's Gloo driver: the collective
    vote spreads one rank's flag to the remote ones), else ("launcher", [root])."""
    tree, order, found = _children(), [root], []
    while order:  # breadth first: the topmost mpirun
        pid = order.pop(0)
        if _name(pid) in MPI_LAUNCHERS:
            return "mpirun", [pid]
        found.append(pid)
        order.extend(tree.get(pid, []))
    ranks = [pid for pid in found if pid != root and _is_rank(pid)]
    return ("ranks", ranks) if ranks else ("launcher", [root])


def supervise(command: list[str], env: dict[str, str], marker: Path | None, stop_names: tuple[str, ...]) -> int:
    """Run the launcher as a child (own process group, so a terminal's Ctrl-C reaches only us) and turn
    TERM/INT/USR1/USR2/HUP into what makes the ranks stop with a checkpoint: the first into the ranks'
    stop signal (SIGUSR1 when --stop_signals has it) at mpirun or the local ranks, the second into
    SIGTERM there, a third into SIGKILL of the launcher's process group. Returns the launcher's status,
    or 75 when the trainer wrote its stop marker (horovodrun itself exits 1 when ranks exit non-zero)."""
    import signal
    import subprocess
    import time

    started = time.time()
    child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, process_group=0)
    asks = [0]
    rank_signal = next((n for n in ("USR1", "USR2", "TERM", "INT") if n in stop_names), None)

    def forward(signum, frame) -> None:
        asks[0] += 1
        got = signal.Signals(signum).name
        if asks[0] >= 3:
            what, targets, send = "launcher group", [-child.pid], signal.SIGKILL
        else:
            what, targets = stop_targets(child.pid)
            name = rank_signal if (asks[0] == 1 and rank_signal) else ("TERM" if stop_names else got[3:])
            send = getattr(signal, f"SIG{name}")
        print(
            f"hvd-ngp-launch: got {got}: {send.name} to {what} {[abs(t) for t in targets]}", file=sys.stderr, flush=True
        )
        for target in targets:
            try:
                os.killpg(-target, send) if target < 0 else os.kill(target, send)
            except ProcessLookupError:
                pass

    for name in FORWARDED:
        signal.signal(getattr(signal, f"SIG{name}"), forward)
    rc = child.wait()
    rc = 128 - rc if rc < 0 else rc
    try:
        stopped = marker is not None and marker.stat().st_mtime >= started - 1
    except OSError:
        stopped = False
    if stopped:
        print(
            f"hvd-ngp-launch: training stopped on a signal with a checkpoint ({marker}); exit status "
            f"{EXIT_PREEMPTED} (launcher status {rc})",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_PREEMPTED
    return rc


def cli(argv: list[str] | None = None) -> None:
    run_cli(main, argv, prog="hvd-ngp-launch")


if __name__ == "__main__":
    cli()
