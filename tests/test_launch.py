"""The launcher's command lines and checks (``plan``), its CLI, and option names that horovodrun accepts."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT, horovodrun

from hvd_ngp.config import BASE_CONFIG, build_parser as trainer_parser, parse_args
from hvd_ngp.errors import ConfigError
from hvd_ngp.tools.launch import parse_options, plan, split_program_args


def make_plan(launcher_args: list[str], trainer_args: list[str] = (), environ: dict | None = None):
    opts = parse_options(launcher_args)
    comm = parse_args(list(trainer_args), default_config=BASE_CONFIG).comm
    return plan(opts, environ or {}, list(trainer_args), comm)


def config_with(tmp_path, distributed: dict) -> str:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"parent": str(BASE_CONFIG), "distributed": distributed}))
    return str(path)


@pytest.fixture()
def two_nodes(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# two nodes, two GPUs each\nnode1 slots=2\nnode2 slots=2\n")
    return str(path)


def after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_one_machine_default(tmp_path):
    p = make_plan(["-np", "2"], ["--n_steps", "5"])
    assert p.placement.ranks_per_host == (("localhost", 2),)
    assert p.command[1:5] == ["-np", "2", "-H", "localhost:2"]
    assert "--mpi" not in p.command and "--gloo" not in p.command  # horovodrun's default controller
    assert p.command[-5:] == [sys.executable, "-m", "hvd_ngp.train", "--n_steps", "5"]
    assert p.env == {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}


def test_two_nodes_choose_mpi_and_hierarchical(two_nodes):
    p = make_plan(["--hostfile", two_nodes, "--fabric", "eth", "--iface", "eth1"])
    assert p.command[1:5] == ["-np", "4", "-H", "node1:2,node2:2"]
    assert "--mpi" in p.command and after(p.command, "--network-interfaces") == "eth1"
    assert p.env == {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth1"}
    assert any("hierarchical allreduce: on (auto: 2 nodes, NCCL and MPI both use TCP)" in n for n in p.notes)
    # the printed line is runnable as is: VAR=value ... horovodrun ...
    line = p.shell_line()
    assert line.startswith("HOROVOD_HIERARCHICAL_ALLREDUCE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=eth1 ")
    assert " -np 4 -H node1:2,node2:2 --mpi " in line


@pytest.mark.parametrize(
    "launcher,fabric,on",
    [("horovodrun", "ib", False), ("horovodrun", "auto", False), ("mpirun", "ib", True), ("mpirun", "auto", False)],
)
def test_across_nodes_flat_nccl_unless_mpi_is_as_fast(two_nodes, launcher, fabric, on):
    """horovodrun forces MPI onto TCP, so on InfiniBand NCCL's flat allreduce is the default (no MPI needed)."""
    p = make_plan(["--hostfile", two_nodes, "--launcher", launcher, "--fabric", fabric])
    assert p.env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == ("1" if on else "0")
    if launcher == "horovodrun":
        assert "--mpi" not in p.command  # nothing needs the MPI controller
    assert any(n.startswith("hierarchical allreduce: " + ("on" if on else "off")) for n in p.notes), p.notes


def test_two_nodes_under_gloo_leave_hierarchical_off(two_nodes):
    p = make_plan(["--hostfile", two_nodes, "--controller", "gloo"])
    assert "--gloo" in p.command and p.env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"
    with pytest.raises(ConfigError, match="needs the MPI controller"):
        make_plan(["--hostfile", two_nodes, "--controller", "gloo"], ["--hierarchical_allreduce", "on"])


def test_mpirun_command(two_nodes):
    p = make_plan(
        [
            "--hostfile",
            two_nodes,
            "-np",
            "3",
            "--launcher",
            "mpirun",
            "--fabric",
            "ib",
            "--ib-gid-index",
            "3",
            "--iface",
            "ib0",
            "--env",
            "NCCL_DEBUG=WARN",
            "--ssh-port",
            "2222",
        ],
        environ={"PATH": "/usr/bin", "NCCL_NET_GDR_LEVEL": "PHB", "HOME": "/root"},
    )
    c = p.command
    assert c[0].endswith("mpirun") and after(c, "-np") == "3" and after(c, "-H") == "node1:2,node2:1"
    assert after(c, "--bind-to") == "none" and after(c, "--map-by") == "slot"
    assert "btl_tcp_if_include" in c and "oob_tcp_if_include" in c and after(c, "plm_rsh_args") == "-p 2222"
    exported = {c[i + 1] for i, a in enumerate(c) if a == "-x"}
    # presets, the user's NCCL_* variables and PATH reach every rank; unrelated variables do not
    assert exported == {
        "HOROVOD_HIERARCHICAL_ALLREDUCE",
        "NCCL_IB_DISABLE",
        "NCCL_IB_GID_INDEX",
        "NCCL_SOCKET_IFNAME",
        "NCCL_DEBUG",
        "NCCL_NET_GDR_LEVEL",
        "PATH",
    }
    assert p.env["NCCL_IB_GID_INDEX"] == "3" and p.env["NCCL_DEBUG"] == "WARN"
    assert "pml" not in c  # on InfiniBand Open MPI picks UCX itself
    eth = make_plan(["--hostfile", two_nodes, "--launcher", "mpirun", "--fabric", "eth"]).command
    assert after(eth, "pml") == "ob1" and after(eth, "btl") == "tcp,self,vader"
    with pytest.raises(ConfigError, match="--launcher mpirun runs the MPI controller"):
        make_plan(["--launcher", "mpirun", "--controller", "gloo"])


def test_user_nccl_variables_override_presets(two_nodes):
    p = make_plan(["--hostfile", two_nodes, "--fabric", "eth"], environ={"NCCL_IB_DISABLE": "0"})
    assert "NCCL_IB_DISABLE" not in p.env
    assert any("NCCL_IB_DISABLE=0 from your environment overrides the preset 1" in n for n in p.notes)


@pytest.mark.parametrize(
    "block,launcher_args,message",
    [
        ({"world_size": 8}, ["-np", "4"], "distributed.world_size is 8 but the job runs 4 rank(s)"),
        ({"world_size": 8}, [], "distributed.world_size is 8 but "),
        ({"enable": False}, [], "distributed.enable is false but the job runs 4 ranks"),
        ({"topology": "single_node"}, [], "distributed.topology is single_node but the job spans 2 nodes"),
        ({"topology": "multi_node"}, ["-np", "2"], "distributed.topology is multi_node but the job runs on one node"),
        ({"allreduce_algorithm": "hierarchical"}, ["--controller", "gloo"], "needs the MPI controller"),
        ({"master_addr": "node2"}, [], "distributed.master_addr is 'node2' but rank 0 runs on 'node1'"),
    ],
)
def test_distributed_block_mismatch_names_the_config(block, launcher_args, message, two_nodes, tmp_path):
    config = config_with(tmp_path, block)
    with pytest.raises(ConfigError) as err:
        make_plan(["--hostfile", two_nodes, *launcher_args], ["--config", config])
    assert str(err.value).startswith(config) or "MPI controller" in str(err.value), err.value
    assert message in str(err.value), err.value


def test_distributed_block_is_honoured(two_nodes, tmp_path):
    topo = tmp_path / "topo.xml"
    topo.write_text("<system/>")
    config = config_with(
        tmp_path,
        {
            "enable": True,
            "world_size": 2,
            "master_addr": "node1",
            "master_port": 29500,
            "nccl_topology_file": str(topo),
            "nccl_algorithm": "Ring,Tree",
            "topology": "auto",
            "allreduce_algorithm": "ring",
        },
    )
    p = make_plan(["--hostfile", two_nodes], ["--config", config])
    assert p.placement.np == 2 and p.placement.nodes == 1  # -np from world_size
    assert p.env["NCCL_TOPO_FILE"] == str(topo) and p.env["NCCL_ALGO"] == "Ring,Tree"
    assert p.env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"  # allreduce_algorithm "ring"
    with pytest.raises(ConfigError, match="sets NCCL_ALGO=Ring,Tree but the environment has NCCL_ALGO=Tree"):
        make_plan(["--hostfile", two_nodes], ["--config", config], environ={"NCCL_ALGO": "Tree"})
    with pytest.raises(ConfigError, match="allreduce_algorithm is ring but --hierarchical_allreduce is on"):
        make_plan(["--hostfile", two_nodes], ["--config", config, "--hierarchical_allreduce", "on"])


@pytest.mark.parametrize(
    "block,message",
    [
        ({"world_size": 0}, "distributed.world_size must be a positive integer"),
        ({"master_port": 70000}, "distributed.master_port must be a port number"),
        ({"nccl_algorithm": "fastest"}, "distributed.nccl_algorithm must be"),
        ({"topology": "ring"}, "distributed.topology must be auto | single_node | multi_node"),
        ({"enable": "yes"}, "distributed.enable must be true or false"),
        ({"backend": "nccl"}, "unknown key(s) in 'distributed': backend"),
    ],
)
def test_bad_distributed_block(block, message, tmp_path):
    config = config_with(tmp_path, block)
    with pytest.raises(ConfigError) as err:
        parse_args(["--config", config])
    assert str(err.value).startswith(config) and message in str(err.value), err.value


def test_adasum_needs_mpi_and_power_of_two(two_nodes):
    p = make_plan(["-np", "2"], ["--reduce_op", "adasum"])
    assert "--mpi" in p.command
    with pytest.raises(ConfigError, match="power-of-2"):
        make_plan(["--hostfile", two_nodes, "-np", "3"], ["--reduce_op", "adasum"])
    with pytest.raises(ConfigError, match="needs the MPI controller"):
        make_plan(["-np", "2", "--controller", "gloo"], ["--reduce_op", "adasum"])


def test_slurm_allocation(tmp_path):
    env = {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_TASKS_PER_NODE": "4(x2)"}
    p = make_plan(["--slurm"], environ=env)
    assert after(p.command, "-H") == "gpu01:4,gpu02:4" and after(p.command, "-np") == "8"


def test_split_program_args():
    assert split_program_args(["-np", "2", "--", "--n_steps", "3"]) == (["-np", "2"], ["--n_steps", "3"])
    assert split_program_args(["-np", "2"]) == (["-np", "2"], [])


def run_launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hvd_ngp.tools.launch", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_cli_dry_run_prints_command_and_environment(two_nodes, tmp_path):
    out = tmp_path / "slurm_hosts"
    proc = run_launch(
        "--hostfile", two_nodes, "--fabric", "eth", "--write-hostfile", str(out), "--dry-run", "--", "--n_steps", "7"
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"# hvd_ngp launch: 4 rank(s) on 2 node(s) [node1:2, node2:2] from {two_nodes}"
    assert "NCCL_IB_DISABLE=1" in lines and "HOROVOD_HIERARCHICAL_ALLREDUCE=1" in lines
    assert lines[-1].endswith("-m hvd_ngp.train --n_steps 7") and " --mpi " in lines[-1]
    assert out.read_text() == "node1 slots=2\nnode2 slots=2\n"


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "hosts"
    bad.write_text("node1 slots=2\nnode2 slot=2\n")
    proc = run_launch("--hostfile", str(bad), "--dry-run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"hvd-ngp-launch: error: {bad}:2: unknown key 'slot' (known: slots, max_slots)"
    proc = run_launch("--hostfile", str(bad).replace("hosts", "none"), "--dry-run", "--", "--n_steps", "0")
    assert proc.returncode == 2 and "--n_steps must be positive" in proc.stderr  # trainer options checked first


def horovodrun_options() -> set[str]:
    text = subprocess.run([horovodrun(), "--help"], capture_output=True, text=True, timeout=120).stdout
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))


def test_trainer_options_are_not_ambiguous_under_horovodrun():
    """horovodrun parses the whole command line: a flag after the script that is a prefix of two or
    more of its options is rejected as ambiguous (docs/troubleshooting.md)."""
    theirs = horovodrun_options()
    assert "--network-interfaces" in theirs and "--fusion-threshold-mb" in theirs
    ours = {s for a in trainer_parser()._actions for s in a.option_strings if s.startswith("--")}
    for module in ("hvd_ngp.bench._scaling_rank",):
        ours |= set(__import__(module, fromlist=["build_parser"]).build_parser()._option_string_actions)
    ambiguous = {o: sorted(t for t in theirs if t.startswith(o)) for o in ours}
    ambiguous = {o: m for o, m in ambiguous.items() if len(m) > 1 and o not in theirs}
    assert not ambiguous, ambiguous


def test_plan_projects_the_exchange_and_names_the_faster_mode(tmp_path):
    """Across 4 ib nodes the note gives the fabric model's projection for the job's own mode (flat NCCL under
    horovodrun), the same numbers as bench fabric, and delayed_grid+fp16's beside it; a job already in that mode
    gets no suggestion; one node gets the NVLink projection."""
    from hvd_ngp.cluster import fabric_model as fm

    hosts = tmp_path / "ib4"
    hosts.write_text("".join(f"gpu{i} slots=4\n" for i in range(4)))
    p = make_plan(["--hostfile", str(hosts), "--fabric", "ib"])
    note = next(n for n in p.notes if n.startswith("exchange (projected by the fabric model, not measured"))
    f = fm.fabric("ib4")
    flat = fm.exposed_comm_ms(fm.REFERENCE_STEP_MS, fm.REFERENCE_GRAD_BYTES, 16, f, fm.Mode.parse("flat"))
    late = fm.exposed_comm_ms(
        fm.REFERENCE_STEP_MS, fm.REFERENCE_GRAD_BYTES, 16, f, fm.Mode.parse("delayed_grid+fp16"), fm.DEFAULT_MLP_BYTES
    )
    assert f"flat exposes {flat['exposed_comm_ms']:.2f} ms per step, {flat['efficiency']:.0%} efficiency" in note
    assert f"delayed_grid --compression fp16 would expose {late['exposed_comm_ms']:.2f} ms" in note
    assert "4 H100 nodes on InfiniBand HDR 200 Gb/s" in note and "assumed" not in note
    p = make_plan(
        ["--hostfile", str(hosts), "--fabric", "ib"], ["--grad_sync", "delayed_grid", "--compression", "fp16"]
    )
    note = next(n for n in p.notes if n.startswith("exchange"))
    assert f"exposes {late['exposed_comm_ms']:.2f} ms" in note and "would expose" not in note
    p = make_plan(["-np", "4"])
    assert any(n.startswith("exchange") and "one NVLink node" in n for n in p.notes)
    assert not any(n.startswith("exchange") for n in make_plan(["-np", "1"]).notes)


def test_job_mode_follows_the_trainer_options():
    from hvd_ngp.cluster import fabric_model as fm

    def mode(args: list[str], hierarchical=None) -> fm.Mode:
        comm = parse_args(args, default_config=BASE_CONFIG).comm
        return fm.job_mode(comm.summary({}, 1.0), hierarchical)

    assert mode([]) == fm.Mode.parse("flat")
    assert mode([], "tcp").hierarchical == "tcp" and mode([], "rdma").hierarchical == "rdma"
    assert mode(["--compression", "fp16"]).fp16
    assert mode(["--backward_passes_per_step", "4"]).accumulate == 4
    periodic = mode(["--grad_sync", "periodic", "--sync_period", "8"])
    assert periodic.period == 8 and periodic.sync == "periodic8"
    late = mode(["--grad_sync", "delayed_grid", "--compression", "fp16", "--delay_compensation", "local"])
    assert late.sync == "delayed_grid+fp16+comp" and late.fp16
