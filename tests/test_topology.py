"""Hostfiles, SLURM allocations, placement, hierarchical-allreduce rule, NCCL presets (no ranks needed)."""

from __future__ import annotations

import pytest

from hvd_ngp.cluster.topology import (
    expand_nodelist,
    expand_tasks_per_node,
    hierarchical_allreduce,
    mpi_as_fast_as_nccl,
    nccl_presets,
    parse_host_arg,
    parse_hostfile,
    parse_hostfile_text,
    passthrough_names,
    place,
    slurm_hosts,
)
from hvd_ngp.errors import ConfigError

GOOD_HOSTFILES = [
    ("a slots=4\nb slots=4\n", [("a", 4), ("b", 4)]),
    ("# two nodes\n\n  a slots=2   # trailing comment\n\nb slots=1 max_slots=4\n", [("a", 2), ("b", 1)]),
    ("10.0.0.1 slots=8\n10.0.0.2 slots=8 max-slots=8\n", [("10.0.0.1", 8), ("10.0.0.2", 8)]),
    ("node_1.cluster slots=3", [("node_1.cluster", 3)]),
]


@pytest.mark.parametrize("text,expected", GOOD_HOSTFILES)
def test_good_hostfiles(text, expected, tmp_path):
    path = tmp_path / "hosts"
    path.write_text(text)
    hosts = parse_hostfile(path)
    assert [(h.name, h.slots) for h in hosts.hosts] == expected
    assert hosts.total_slots == sum(s for _, s in expected)
    # the -H form and the normalised hostfile describe the same hosts
    assert parse_host_arg(hosts.host_arg()).hosts == tuple(h.__class__(h.name, h.slots) for h in hosts.hosts)
    assert [(h.name, h.slots) for h in parse_hostfile_text(hosts.hostfile_text(), "x").hosts] == expected


BAD_HOSTFILES = [
    ("a slots=2\na slots=2\n", ":2: host 'a' is listed twice (first at", "duplicate"),
    ("a slots=2\nb gpus=4\n", ":2: unknown key 'gpus'", "unknown key"),
    ("a\n", ":1: host 'a' has no slots=N", "missing slots"),
    ("a slots=0\n", ":1: slots must be a positive integer, got 0", "zero slots"),
    ("a slots=four\n", ":1: slots must be a positive integer, got 'four'", "non-numeric slots"),
    ("# only comments\n\n", ": the hostfile lists no hosts", "empty"),
    ("a slots = 2\n", ":1: expected key=value after the host name", "spaces around ="),
    ("a:2\n", ":1: expected 'host slots=N'", "-H syntax in a file"),
    ("a slots=2 slots=3\n", ":1: slots given twice", "repeated key"),
    ("a slots=4 max_slots=2\n", ":1: max_slots=2 is less than slots=4", "max below slots"),
    ("ok slots=1\nb@d slots=1\n", ":2: 'b@d' is not a host name", "bad name"),
]


@pytest.mark.parametrize("text,message,case", BAD_HOSTFILES, ids=[c for _, _, c in BAD_HOSTFILES])
def test_bad_hostfiles_name_file_and_line(text, message, case, tmp_path):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        parse_hostfile(path)
    assert str(err.value).startswith(str(path)), err.value
    assert message in str(err.value), err.value


def test_missing_hostfile(tmp_path):
    with pytest.raises(ConfigError, match="hostfile not found"):
        parse_hostfile(tmp_path / "nope")


def test_host_arg():
    assert [(h.name, h.slots) for h in parse_host_arg("a:2,b,c:4").hosts] == [("a", 2), ("b", 1), ("c", 4)]
    for bad, message in (
        ("a:0", "positive integer"),
        ("a:2,a:2", "listed twice"),
        ("a:x", "positive integer"),
        ("", "not a host name"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_host_arg(bad)


def test_placement_fills_hosts_in_order():
    hosts = parse_host_arg("a:4,b:4,c:4")
    full = place(hosts)
    assert full.np == 12 and full.nodes == 3 and full.homogeneous and full.root_host == "a"
    six = place(hosts, 6)
    assert six.ranks_per_host == (("a", 4), ("b", 2)) and six.nodes == 2 and not six.homogeneous
    one = place(hosts, 3)
    assert one.nodes == 1 and one.local_sizes == (3,)
    with pytest.raises(ConfigError, match=r"-H a:4,b:4,c:4: -np 13 is more than the 12 slot\(s\)"):
        place(hosts, 13)
    with pytest.raises(ConfigError, match="-np must be positive"):
        place(hosts, 0)


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("login1,node[8-10]", ["login1", "node8", "node9", "node10"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("a,b[009-011],c", ["a", "b009", "b010", "b011", "c"]),
        ("single", ["single"]),
    ],
)
def test_slurm_nodelist(spec, expected):
    assert expand_nodelist(spec) == expected


@pytest.mark.parametrize(
    "spec,message",
    [
        ("gpu[01-", "unbalanced '['"),
        ("gpu01]", "unbalanced ']'"),
        ("gpu[4-1]", "runs backwards"),
        ("gpu[a-b]", "bad range"),
        ("gpu[[1]]", "nested"),
    ],
)
def test_bad_slurm_nodelist(spec, message):
    with pytest.raises(ConfigError) as err:
        expand_nodelist(spec)
    assert message in str(err.value) and str(err.value).startswith("SLURM_JOB_NODELIST: ")


def test_slurm_tasks_per_node():
    assert expand_tasks_per_node("4(x2),2", 3, "X") == [4, 4, 2]
    assert expand_tasks_per_node("2", 3, "X") == [2, 2, 2]
    assert expand_tasks_per_node("1(x3)", 3, "X") == [1, 1, 1]
    with pytest.raises(ConfigError, match=r"X='4\(x2\)' describes 2 node\(s\) but the allocation has 3"):
        expand_tasks_per_node("4(x2)", 3, "X")
    with pytest.raises(ConfigError, match="cannot read"):
        expand_tasks_per_node("4x2", 2, "X")


def test_slurm_hosts_from_environment():
    env = {"SLURM_JOB_NODELIST": "gpu[01-03]", "SLURM_TASKS_PER_NODE": "4(x2),2"}
    hosts = slurm_hosts(env)
    assert [(h.name, h.slots) for h in hosts.hosts] == [("gpu01", 4), ("gpu02", 4), ("gpu03", 2)]
    assert "SLURM_JOB_NODELIST=gpu[01-03]" in hosts.source
    # SLURM_NTASKS_PER_NODE (from --ntasks-per-node) wins; nothing at all means one task per node
    assert [h.slots for h in slurm_hosts({**env, "SLURM_NTASKS_PER_NODE": "8"}).hosts] == [8, 8, 8]
    assert [h.slots for h in slurm_hosts({"SLURM_NODELIST": "a,b"}).hosts] == [1, 1]
    with pytest.raises(ConfigError, match="not inside a SLURM allocation"):
        slurm_hosts({})


def test_hierarchical_rule():
    fast = (True, "NCCL and MPI both use TCP")
    assert hierarchical_allreduce("auto", 2, "mpi", fast) == (True, "auto: 2 nodes, NCCL and MPI both use TCP")
    assert hierarchical_allreduce("auto", 2, None, fast)[0]  # the launcher then picks MPI
    assert hierarchical_allreduce("auto", 2, "mpi")[0] is False  # MPI's transport unknown: flat NCCL
    assert hierarchical_allreduce("auto", 4, "mpi", (False, "slow"))[1] == "auto: 4 nodes; flat NCCL allreduce: slow"
    assert hierarchical_allreduce("auto", 1, "mpi") == (False, "auto: one node")
    assert hierarchical_allreduce("auto", 4, "gloo")[0] is False
    assert hierarchical_allreduce("off", 4, "mpi")[0] is False
    assert hierarchical_allreduce("on", 1, "mpi")[0] is True
    with pytest.raises(ConfigError, match="needs the MPI controller"):
        hierarchical_allreduce("on", 2, "gloo")


def test_nccl_presets():
    assert nccl_presets("auto") == {}
    assert nccl_presets("eth", "eth1") == {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth1"}
    assert nccl_presets("ib", "ib0", 3) == {
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "ib0",
        "NCCL_IB_GID_INDEX": "3",
    }
    assert "NCCL_ALGO" not in nccl_presets("ib")
    with pytest.raises(ConfigError, match="--ib-gid-index applies to --fabric ib"):
        nccl_presets("eth", None, 3)


def test_passthrough_keeps_user_nccl_variables():
    env = {"NCCL_DEBUG": "INFO", "HOROVOD_TIMELINE": "t.json", "PATH": "/bin", "HOME": "/root", "SECRET": "x"}
    assert passthrough_names(env) == ["HOROVOD_TIMELINE", "NCCL_DEBUG", "PATH"]


def test_repository_hostfiles_parse_with_ours_and_with_horovodrun():
    """Users run ``horovodrun -np 16 -hostfile hostfiles/ib4 ...``: horovodrun 0.28 reads every line as
    ``host slots=N`` (a comment line stops it), so the shipped hostfiles must be plain."""
    pytest.importorskip("horovod")
    from conftest import ROOT
    from horovod.runner.common.util.hosts import parse_host_files, parse_hosts_and_slots

    files = sorted(p for p in (ROOT / "hostfiles").iterdir() if p.suffix != ".md")
    assert {p.name for p in files} >= {"ib4", "localhost"}
    for path in files:
        ours = parse_hostfile(path)
        names, slots = parse_hosts_and_slots(parse_host_files(str(path)))
        assert names == [h.name for h in ours.hosts] and sum(slots.values()) == ours.total_slots > 0, path


def test_mpi_transport_rule():
    """Hierarchical allreduce pays only where MPI crosses nodes as fast as NCCL (docs/scaling.md)."""
    assert (
        mpi_as_fast_as_nccl("horovodrun", "eth", {})[0] and mpi_as_fast_as_nccl(None, None, {"NCCL_IB_DISABLE": "1"})[0]
    )
    assert mpi_as_fast_as_nccl("mpirun", "ib", {})[0] and mpi_as_fast_as_nccl(None, None, {"OMPI_MCA_pml": "ucx"})[0]
    assert mpi_as_fast_as_nccl("horovodrun", "ib", {}) == (
        False,
        "horovodrun runs MPI over TCP (pml ob1) while NCCL can use InfiniBand",
    )
    assert not mpi_as_fast_as_nccl("horovodrun", "auto", {})[0] and not mpi_as_fast_as_nccl("mpirun", "auto", {})[0]
