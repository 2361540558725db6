"""Communication settings: the horovod option group, the environment set before hvd.init, the LR rule."""

from __future__ import annotations

import math

import pytest
import torch

from hvd_ngp.cluster.comm import CommSettings, describe_allreduce, launcher_controller, launcher_sizes
from hvd_ngp.config import BASE_CONFIG, parse_args
from hvd_ngp.errors import ConfigError
from hvd_ngp.training.recipe import make_scaler


def settings(*argv: str) -> CommSettings:
    return parse_args(list(argv), default_config=BASE_CONFIG).comm


MPI_TWO_NODES = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
MPI_ONE_NODE = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
GLOO_TWO_NODES = {"HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"}


def test_defaults_are_set_before_init():
    env = settings().init_env({}, use_cuda=True)
    assert env == {
        "HOROVOD_FUSION_THRESHOLD": str(128 * 2**20),
        "HOROVOD_CYCLE_TIME": "0.1",
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "0",
    }


def test_flags_beat_environment_beats_defaults():
    from_horovodrun = {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": "1048576"}
    env = settings().init_env(from_horovodrun, use_cuda=True)
    assert "HOROVOD_CYCLE_TIME" not in env and "HOROVOD_FUSION_THRESHOLD" not in env  # horovodrun's values stay
    env = settings("--cycle_time_ms", "0.5", "--fusion_threshold_mb", "64").init_env(from_horovodrun, use_cuda=True)
    assert env["HOROVOD_CYCLE_TIME"] == "0.5" and env["HOROVOD_FUSION_THRESHOLD"] == str(64 * 2**20)
    # Horovod's autotuner only tunes what is not set: our defaults step aside, explicit flags do not
    env = settings().init_env({"HOROVOD_AUTOTUNE": "1"}, use_cuda=True)
    assert "HOROVOD_CYCLE_TIME" not in env and "HOROVOD_FUSION_THRESHOLD" not in env
    assert settings("--cycle_time_ms", "2").init_env({"HOROVOD_AUTOTUNE": "1"}, True)["HOROVOD_CYCLE_TIME"] == "2"


def test_elastic_jobs_leave_the_fusion_threshold_to_horovod():
    """Horovod 0.28.1 segfaults re-forming an elastic world with HOROVOD_FUSION_THRESHOLD set."""
    env = settings().init_env({"HOROVOD_ELASTIC": "1"}, use_cuda=False)
    assert "HOROVOD_FUSION_THRESHOLD" not in env and env["HOROVOD_CYCLE_TIME"] == "0.1"
    for argv, environ in (
        (("--fusion_threshold_mb", "64"), {}),
        ((), {"HOROVOD_FUSION_THRESHOLD": "1"}),
        ((), {"HOROVOD_AUTOTUNE": "1"}),
    ):
        with pytest.raises(ConfigError, match="elastic training: leave the tensor-fusion threshold to Horovod"):
            settings(*argv).init_env({"HOROVOD_ELASTIC": "1", **environ}, use_cuda=False)


def test_hierarchical_auto_follows_the_launch():
    auto = settings()
    # across nodes only where MPI's transport is as fast as NCCL's (UCX, or both on TCP); unknown: flat NCCL
    assert auto.init_env(MPI_TWO_NODES, use_cuda=True)["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"
    assert auto.init_env({**MPI_TWO_NODES, "OMPI_MCA_pml": "ucx"}, True)["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert auto.init_env({**MPI_TWO_NODES, "OMPI_MCA_pml": "ob1"}, True)["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"
    assert auto.init_env({**MPI_TWO_NODES, "NCCL_IB_DISABLE": "1"}, True)["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert auto.init_env(MPI_ONE_NODE, use_cuda=True)["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"
    assert auto.init_env(GLOO_TWO_NODES, use_cuda=True)["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"
    assert (
        auto.init_env({**MPI_TWO_NODES, "OMPI_MCA_pml": "ucx"}, False)["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"
    )  # NCCL-only
    # a launcher's decision is kept by auto, overridden by an explicit flag
    assert "HOROVOD_HIERARCHICAL_ALLREDUCE" not in auto.init_env(
        {**MPI_ONE_NODE, "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}, True
    )
    assert (
        settings("--hierarchical_allreduce", "off").init_env(MPI_TWO_NODES, True)["HOROVOD_HIERARCHICAL_ALLREDUCE"]
        == "0"
    )
    with pytest.raises(ConfigError, match="needs the MPI controller"):
        settings("--hierarchical_allreduce", "on").init_env(GLOO_TWO_NODES, use_cuda=True)


def test_launcher_environment_readers():
    assert launcher_sizes(MPI_TWO_NODES) == (4, 2) and launcher_sizes(GLOO_TWO_NODES) == (2, 1)
    assert launcher_sizes({}) == (1, 1)
    assert launcher_controller(GLOO_TWO_NODES) == "gloo" and launcher_controller(MPI_ONE_NODE) == "mpi"
    assert launcher_controller({}) is None


def test_runtime_checks():
    s = settings()
    assert s.check_runtime(4, 2, "mpi", True, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}) == [
        "hierarchical allreduce on (2 node(s))"
    ]
    notes = s.check_runtime(4, 2, "mpi", False, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    assert notes == [describe_allreduce(True, False)] and "no effect on CPU tensors" in notes[0]
    # the same words in bench scaling's report: hierarchical only where asked, and only GPU tensors use it
    assert describe_allreduce(False, True) == describe_allreduce(False, False) == "flat allreduce"
    assert describe_allreduce(True, True) == "hierarchical allreduce"
    with pytest.raises(ConfigError, match="needs the MPI controller"):
        s.check_runtime(2, 1, "gloo", True, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    adasum = settings("--reduce_op", "adasum")
    adasum.check_runtime(4, 4, "mpi", False, {})
    with pytest.raises(ConfigError, match="power-of-2"):
        adasum.check_runtime(3, 3, "mpi", False, {})
    with pytest.raises(ConfigError, match="needs the MPI controller"):
        adasum.check_runtime(2, 2, "gloo", False, {})


def test_option_validation():
    for argv, message in (
        (["--backward_passes_per_step", "0"], "--backward_passes_per_step must be >= 1"),
        (["--cycle_time_ms", "-1"], "--cycle_time_ms must be >= 0"),
        (["--reduce_op", "adasum", "--precision", "fp16"], "adasum does not support --precision fp16"),
    ):
        with pytest.raises(ConfigError, match=message):
            settings(*argv)


def test_learning_rate_rule():
    assert settings().lr_multiplier(4, 4, True) == pytest.approx(2.0)  # sqrt(4)
    assert settings("--backward_passes_per_step", "2").lr_multiplier(8, 4, True) == pytest.approx(4.0)  # sqrt(16)
    assert settings("--lr_scaling", "linear").lr_multiplier(4, 4, True) == 4.0
    assert settings("--lr_scaling", "none").lr_multiplier(16, 4, True) == 1.0
    assert settings("--reduce_op", "adasum").lr_multiplier(8, 4, True) == 4.0  # GPUs per node (Horovod's guide)
    assert settings("--reduce_op", "adasum").lr_multiplier(8, 4, False) == 1.0
    assert settings().lr_multiplier(1, 1, False) == 1.0 and math.isfinite(settings().lr_multiplier(32, 8, True))


def test_fp16_compression_runs_under_loss_scaling():
    cpu = torch.device("cpu")
    assert make_scaler("fp32", settings(), cpu, 2) is None
    assert make_scaler("fp32", settings("--compression", "fp16"), cpu, 1) is None  # nothing is compressed at size 1
    scaler = make_scaler("fp32", settings("--compression", "fp16"), cpu, 2)
    assert scaler is not None and scaler.get_scale() == 2.0**16
    assert make_scaler("fp16", settings(), cpu, 1) is not None
    assert make_scaler("fp32", settings("--compression", "fp16", "--reduce_op", "adasum"), cpu, 2) is None


def test_summary_reports_what_horovod_reads():
    s = settings("--compression", "fp16")
    env = {
        "HOROVOD_FUSION_THRESHOLD": str(64 * 2**20),
        "HOROVOD_CYCLE_TIME": "0.1",
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
    }
    summary = s.summary(env, 1.5)
    assert summary["fusion_threshold_mb"] == 64 and summary["cycle_time_ms"] == 0.1
    assert (
        summary["hierarchical_allreduce"] is True
        and summary["compression"] == "fp16"
        and summary["lr_multiplier"] == 1.5
    )
    assert s.describe(env, 1.5, 2, ["note"]).startswith(
        "communication: 2 node(s), fusion 64 MiB, cycle 0.1 ms, compression fp16"
    )


def test_per_host_checks(tmp_path):
    from hvd_ngp.cluster.comm import DistributedBlock

    topo = tmp_path / "topo.xml"
    topo.write_text("<system/>")
    DistributedBlock.parse({"master_addr": "localhost", "nccl_topology_file": str(topo)}, "c.json").check_host(True)
    DistributedBlock.parse({"master_addr": "no-such-host.invalid"}, "c.json").check_host(False)  # only rank 0 checks
    with pytest.raises(
        ConfigError, match="c.json: distributed.master_addr is 'no-such-host.invalid' but rank 0 runs on"
    ):
        DistributedBlock.parse({"master_addr": "no-such-host.invalid"}, "c.json").check_host(True)
    with pytest.raises(ConfigError, match="c.json: distributed.nccl_topology_file .*missing.xml: no such file"):
        DistributedBlock.parse({"nccl_topology_file": str(tmp_path / "missing.xml")}, "c.json").check_host(False)
