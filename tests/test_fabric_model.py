"""The fabric model (alpha-beta ring costs, modes, presets), time-to-quality projection, ``bench fabric`` CLI,
and the parsing of NCCL's transport report. Pure Python: no ranks, no Horovod."""

from __future__ import annotations

import json

import pytest
import torch

from hvd_ngp.bench import fabric as fabric_bench
from hvd_ngp.cluster import fabric_model as fm, nccl_net
from hvd_ngp.errors import ConfigError

S = 46.5 * fm.MIB


def test_ring_allreduce_is_the_alpha_beta_formula():
    link = fm.Link("test", 10.0, 2.0, "")
    # 2 (n - 1) alpha + 2 (n - 1) / n * S / B
    assert fm.ring_allreduce_s(4, 1e9, link) == pytest.approx(6 * 2e-6 + 1.5 * 1e9 / 10e9)
    assert fm.ring_half_s(4, 1e9, link) == pytest.approx(3 * 2e-6 + 0.75 * 1e9 / 10e9)
    assert fm.ring_allreduce_s(1, 1e9, link) == 0.0


def test_flat_across_nodes_is_bound_by_the_node_nic():
    f = fm.fabric("ib4")
    assert (f.nodes, f.gpus_per_node) == (4, 4)
    one_node = fm.flat_allreduce_s(4, S, f)
    sixteen = fm.flat_allreduce_s(16, S, f)
    assert one_node < 0.5e-3  # NVLink
    assert sixteen == pytest.approx(2 * 15 / 16 * S / (f.inter.gbs * 1e9) + 30 * f.inter.alpha_us * 1e-6)


def test_hierarchical_over_tcp_loses_to_flat_nccl_on_infiniband_and_wins_on_ethernet():
    """The rule behind the launcher default (cluster.topology.mpi_as_fast_as_nccl)."""
    ib = fm.fabric("ib4")
    assert fm.hierarchical_allreduce_s(16, S, ib, "tcp") > 3 * fm.flat_allreduce_s(16, S, ib)
    assert fm.hierarchical_allreduce_s(16, S, ib, "rdma") < 1.1 * fm.flat_allreduce_s(16, S, ib)
    eth = fm.fabric("eth2x2")
    # 2 nodes: the NIC carries 2 (M-1)/M S = S instead of 2 (N-1)/N S = 1.5 S
    assert fm.hierarchical_allreduce_s(4, S, eth, "tcp") < 0.8 * fm.flat_allreduce_s(4, S, eth)


def test_modes():
    f = fm.fabric("ib4")
    flat = fm.exposed_comm_ms(3.3, S, 16, f, fm.Mode.parse("flat"))
    assert flat["efficiency"] == pytest.approx(3.3 / (3.3 + flat["exposed_comm_ms"]))
    assert flat["ranks"] == 16 and flat["nodes"] == 4 and flat["projected"]
    fp16 = fm.exposed_comm_ms(3.3, S, 16, f, fm.Mode.parse("fp16"))
    assert fp16["comm_ms"] == pytest.approx(fm.flat_allreduce_s(16, S / 2, f) * 1e3)
    accum = fm.exposed_comm_ms(3.3, S, 16, f, fm.Mode.parse("accum4"))
    assert accum["exposed_comm_ms"] == pytest.approx(flat["comm_ms"] / 4)
    periodic = fm.exposed_comm_ms(3.3, S, 16, f, fm.Mode.parse("periodic8"))
    assert periodic["exposed_comm_ms"] == pytest.approx(fm.flat_allreduce_s(16, fm.PERIODIC_COPIES * S, f) * 1e3 / 8)
    delayed = fm.exposed_comm_ms(3.3, S, 16, f, fm.Mode.parse("delayed"))
    assert delayed["exposed_comm_ms"] == pytest.approx(max(0.0, flat["comm_ms"] - 3.3))
    hidden = fm.exposed_comm_ms(10.0, S, 16, f, fm.Mode.parse("delayed+fp16"))
    assert hidden["exposed_comm_ms"] == 0.0 and hidden["efficiency"] == 1.0
    # delayed_grid+fp16 as the trainer runs it: the MLPs' part + 3 tail floats waited for in fp32, the grid's in fp16
    mlp = fm.DEFAULT_MLP_BYTES
    wire = fm.exposed_comm_ms(3.3, S, 16, f, fm.Mode.parse("delayed_grid+fp16"), mlp)
    waited = fm.flat_allreduce_s(16, mlp + 12, f) * 1e3
    late = fm.flat_allreduce_s(16, (S - mlp) / 2, f) * 1e3
    assert wire["comm_ms"] == pytest.approx(waited + late)
    assert wire["exposed_comm_ms"] == pytest.approx(waited + max(0.0, late - 3.3))
    # delay compensation sends what delayed_grid sends: the same price (its extra Adam pass is compute)
    comp = fm.exposed_comm_ms(3.3, S, 16, f, fm.Mode.parse("delayed_grid+fp16+comp"), mlp)
    assert {k: v for k, v in comp.items() if k != "mode"} == {k: v for k, v in wire.items() if k != "mode"}
    with pytest.raises(ConfigError, match="comp \\(delay compensation\\) needs delayed_grid"):
        fm.Mode.parse("delayed+comp")
    with pytest.raises(ConfigError, match="unknown mode part 'magic'"):
        fm.Mode.parse("flat+magic")


def test_presets_and_shapes():
    assert set(fm.PRESETS) >= {"h100-nvlink", "h200-nvlink", "rtx4090-pcie", "ib200", "ib400", "eth10", "eth100"}
    f = fm.fabric("ib400", nodes=8, gpus_per_node=8)
    assert f.nodes * f.gpus_per_node == 64 and f.inter.gbs == 45.0
    assert fm.fabric("rtx4090-pcie").intra.gbs < fm.fabric("h100-nvlink").intra.gbs
    with pytest.raises(ConfigError, match="one node"):
        fm.fabric("h100-nvlink", nodes=2)
    with pytest.raises(ConfigError, match="do not fit"):
        fm.project(3.3, S, [32], fm.fabric("ib4"), [fm.Mode.parse("flat")])
    with pytest.raises(ConfigError, match="unknown fabric preset"):
        fm.fabric("token-ring")


def test_emulated_link_model_uses_the_tcp_goodput_of_the_set_rate():
    # 2 ranks: each sends S across one link; a 1514-byte frame carries 1448 payload bytes, plus half an ACK frame
    assert fm.TCP_GOODPUT == pytest.approx(1448 / 1547)
    bandwidth = 1e8 / (1e9 / 8 * 1448 / 1547)
    assert fm.emulated_bandwidth_s(1e8, 2, 1e9) == pytest.approx(bandwidth)
    assert fm.emulated_allreduce_s(1e8, 2, 1e9, "gloo", {"gloo": 0.01}) == pytest.approx(bandwidth + 2 * 0.01)
    assert fm.emulated_allreduce_s(1e8, 4, 1e9, "mpi") == pytest.approx(
        6 * fm.EMULATED_ALPHA_S["mpi"] + 1.5 * bandwidth
    )
    # the fit recovers a planted per-step latency, with the bandwidth term fixed by the rate
    rows = [
        {
            "controller": "mpi",
            "hosts": n,
            "bytes": b,
            "rate_bps": 1e8,
            "measured_s": fm.emulated_allreduce_s(b, n, 1e8, "mpi", {"mpi": 0.007}),
        }
        for n in (2, 4)
        for b in (1e6, 4e6)
    ]
    assert fm.fit_alpha(rows) == {"mpi": pytest.approx(0.007)}
    assert fm.parse_rate_bps("100mbit") == 1e8
    with pytest.raises(ConfigError):
        fm.parse_rate_bps("fast")


STEPS = {
    "scene": "lego",
    "device": "H100",
    "step_ms_per_backward_pass": 3.0,
    "runs": [
        {
            "k": 1,
            "seed": 0,
            "samples_per_step": 262144,
            "step_ms": 3.0,
            "steps_to_psnr": {"33": 8000, "35": 20000},
            "final_psnr": 35.5,
        },
        {
            "k": 1,
            "seed": 1,
            "samples_per_step": 262144,
            "step_ms": 3.0,
            "steps_to_psnr": {"33": 8400, "35": 22000},
            "final_psnr": 35.4,
        },
        {
            "k": 2,
            "seed": 0,
            "samples_per_step": 524288,
            "step_ms": 6.0,
            "steps_to_psnr": {"33": 4100, "35": 10500},
            "final_psnr": 35.6,
        },
        {
            "k": 4,
            "seed": 0,
            "samples_per_step": 1048576,
            "step_ms": 12.0,
            "steps_to_psnr": {"33": 2200, "35": 6000},
            "final_psnr": 35.7,
        },
        {
            "k": 8,
            "seed": 0,
            "samples_per_step": 2097152,
            "step_ms": 24.0,
            "steps_to_psnr": {"33": 2000, "35": 5000},
            "final_psnr": 35.7,
        },
        {
            "k": 16,
            "seed": 0,
            "samples_per_step": 4194304,
            "step_ms": 48.0,
            "steps_to_psnr": {"33": 1900, "35": None},
            "final_psnr": 34.9,
        },
    ],
}


def test_time_to_quality_and_critical_batch():
    f = fm.fabric("h100-nvlink")  # one node of 8: K = 16 does not fit and is left out
    rows = fm.time_to_quality(STEPS, S, f, "33", fm.Mode.parse("flat"))
    assert [r["ranks"] for r in rows] == [1, 2, 4, 8]
    base = rows[0]
    assert base["steps"] == 8200 and base["time_s"] == pytest.approx(8200 * 3.0 / 1e3) and base["speedup"] == 1.0
    two = rows[1]
    exposed = fm.exposed_comm_ms(3.0, S, 2, f, fm.Mode.parse("flat"))["exposed_comm_ms"]
    assert two["time_s"] == pytest.approx(4100 * (3.0 + exposed) / 1e3)
    assert two["speedup"] == pytest.approx(base["time_s"] / two["time_s"])
    assert two["scaling"] == pytest.approx(8200 / (2 * 4100))
    # 8 ranks: 8200 / (8 * 2000) = 0.51 still >= 0.5; the fastest is N = 8
    assert fm.critical_batch(rows) == {"ranks": 8, "fastest": 8}
    ib = fm.fabric("ib4")
    rows35 = fm.time_to_quality(STEPS, S, ib, "35", fm.Mode.parse("flat"))
    assert rows35[-1]["ranks"] == 16 and rows35[-1]["steps"] is None and rows35[-1]["speedup"] is None
    # 4 ranks: 21000 / (4 * 6000) = 0.875; 8 ranks: 21000 / 40000 = 0.525; both count
    assert fm.critical_batch(rows35)["ranks"] == 8


def test_time_to_quality_rejects_bad_files():
    f = fm.fabric("ib4")
    with pytest.raises(ConfigError, match="steps.json: no run with k = 1"):
        fm.time_to_quality(
            {"step_ms_per_backward_pass": 3, "runs": [STEPS["runs"][2]]},
            S,
            f,
            "33",
            fm.Mode.parse("flat"),
            "steps.json",
        )
    with pytest.raises(ConfigError, match=r"runs\[0\] needs 'k' and 'steps_to_psnr' with key '36'"):
        fm.time_to_quality(STEPS, S, f, "36", fm.Mode.parse("flat"), "steps.json")
    with pytest.raises(ConfigError, match="needs 'step_ms_per_backward_pass'"):
        fm.time_to_quality({"runs": []}, S, f, "33", fm.Mode.parse("flat"), "steps.json")


def test_bench_fabric_cli(tmp_path, capsys):
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps(STEPS))
    out = tmp_path / "fabric.json"
    result = fabric_bench.main(
        [
            "--step_ms",
            "3.3",
            "--grad_mib",
            "46.5",
            "--preset",
            "ib4,eth2x2",
            "--json",
            str(out),
            "--steps_json",
            str(steps),
            "--psnr",
            "35",
        ]
    )
    text = capsys.readouterr().out
    assert text.startswith("PROJECTED") and text.count("PROJECTED") >= 4
    assert "Time to 35 dB on lego" in text and "critical batch" in text
    saved = json.loads(out.read_text())
    assert saved["projected"] is True and saved == json.loads(json.dumps(result, default=str))
    row = next(r for r in saved["rows"] if r["fabric"] == "ib4" and r["ranks"] == 16 and r["mode"] == "flat")
    assert {"ranks", "nodes", "mode", "exposed_comm_ms", "efficiency"} <= set(row)
    assert row["exposed_comm_ms"] == pytest.approx(fm.flat_allreduce_s(16, S, fm.fabric("ib4")) * 1e3)
    assert {r["ranks"] for r in saved["rows"] if r["fabric"] == "eth2x2"} == {1, 2, 4}


def test_bench_fabric_reads_a_throughput_json(tmp_path, capsys):
    path = tmp_path / "throughput.json"
    path.write_text(
        json.dumps(
            {
                "device": "NVIDIA H100",
                "training": [
                    {
                        "backend": "torch",
                        "precision": "fp32",
                        "step_ms": 9.0,
                        "samples_per_step": 1e5,
                        "gradient_bytes": {"encoding": 1},
                    },
                    {
                        "backend": "triton",
                        "precision": "bf16",
                        "step_ms": 3.3,
                        "samples_per_step": 262144,
                        "gradient_bytes": {
                            "encoding": int(46 * fm.MIB),
                            "density_mlp": int(0.25 * fm.MIB),
                            "rgb_mlp": int(0.25 * fm.MIB),
                        },
                    },
                ],
            }
        )
    )
    result = fabric_bench.main(["--from_json", str(path), "--preset", "ib4", "--ranks", "16", "--modes", "flat"])
    assert result["step_ms"] == 3.3 and result["grad_bytes"] == pytest.approx(S, rel=1e-6)
    assert "triton bf16" in capsys.readouterr().out
    path.write_text(json.dumps({"training": [{"backend": "triton", "step_ms": 3.3}]}))
    with pytest.raises(ConfigError, match="throughput.json: the triton entry has no 'gradient_bytes'"):
        fabric_bench.main(["--from_json", str(path)])
    with pytest.raises(ConfigError, match="give --step_ms and --grad_mib"):
        fabric_bench.main(["--step_ms", "3.3"])


# ------------------------------------------------------------------------------------- NCCL's transport report

IB_LOG = """\
gpu-node01:2201:2260 [0] NCCL INFO Bootstrap : Using ib0:10.10.0.1<0>
gpu-node01:2201:2260 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so), using internal implementation
gpu-node01:2201:2260 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.10.0.1<0>
gpu-node01:2201:2260 [0] NCCL INFO Using network IB
gpu-node01:2201:2270 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC
gpu-node01:2201:2270 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [receive] via NET/IB/0
"""
SOCKET_LOG = """\
[1,0]<stdout>:gpu-node01:2201:2260 [0] NCCL INFO NET/IB : No device found.
[1,0]<stdout>:gpu-node01:2201:2260 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:10.1.0.1<0>
[1,0]<stdout>:gpu-node01:2201:2260 [0] NCCL INFO Using network Socket
[1,0]<stdout>:gpu-node01:2201:2270 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0
"""
ROCE_LOG = (
    "h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.0.0.1<0>\nh:1:2 [0] NCCL INFO Using network IB\n"
)


def test_nccl_transport_is_parsed_from_its_info_lines():
    ib = nccl_net.parse(IB_LOG)
    assert (ib.transport, ib.devices, ib.inter_node) == ("IB", ["mlx5_0:1", "mlx5_1:1"], True)
    assert nccl_net.verdict(ib, ["mlx5_0"]) == (
        "ok",
        "NCCL transport between nodes: IB on mlx5_0:1, mlx5_1:1 (carries inter-node traffic)",
    )
    sock = nccl_net.parse(SOCKET_LOG)
    assert (sock.transport, sock.devices, sock.inter_node) == ("Socket", ["eth0", "eth1"], True)
    severity, text = nccl_net.verdict(sock, ["mlx5_0", "mlx5_1"])
    assert severity == "warning" and "TCP sockets" in text and "mlx5_0, mlx5_1" in text
    assert nccl_net.verdict(sock, [])[0] == "ok"  # sockets on an Ethernet-only host are expected
    roce = nccl_net.parse(ROCE_LOG)
    assert roce.transport == "RoCE" and not roce.inter_node
    assert nccl_net.verdict(nccl_net.parse("no nccl here"), ["mlx5_0"])[0] == "info"


def test_nccl_capture_env_and_file(tmp_path, monkeypatch):
    env = nccl_net.capture_env({}, str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert nccl_net.capture_env({"NCCL_DEBUG": "WARN"}) == {}  # the user's choice stands
    (tmp_path / "hvd_ngp_nccl.node7.4242.log").write_text(SOCKET_LOG)
    (tmp_path / "hvd_ngp_nccl.node7.999.log").write_text(IB_LOG)  # another process
    assert nccl_net.read_capture(env, pid=4242) == SOCKET_LOG
    assert nccl_net.read_capture({}, pid=4242) == ""
    (tmp_path / "infiniband" / "mlx5_0").mkdir(parents=True)
    assert nccl_net.ib_devices(str(tmp_path / "infiniband")) == ["mlx5_0"]
    assert nccl_net.ib_devices(str(tmp_path / "none")) == []


def test_time_to_quality_uses_a_modes_own_steps():
    """delayed_grid+fp16 runs at K = 8 price that mode with its own (more) steps; K = 2 has none, so every's steps
    stand in and the row says so. sync_of names a run the way Mode.sync names a mode."""
    own = {**STEPS["runs"][4], "sync": "delayed_grid+fp16", "steps_to_psnr": {"33": 3000, "35": None}}
    steps = {**STEPS, "runs": [*STEPS["runs"], own]}
    f = fm.fabric("ib4")
    mode = fm.Mode.parse("hierarchical-rdma+delayed_grid+fp16")
    assert mode.sync == "delayed_grid+fp16"
    rows = {r["ranks"]: r for r in fm.time_to_quality(steps, S, f, "33", mode)}
    assert rows[8]["steps"] == 3000 and rows[8]["steps_of"] == "delayed_grid+fp16"
    assert rows[2]["steps"] == 4100 and rows[2]["steps_of"] == "every"
    assert rows[1]["steps_of"] == "every" and rows[1]["steps"] == 8200
    flat = {r["ranks"]: r for r in fm.time_to_quality(steps, S, f, "33", fm.Mode.parse("flat"))}
    assert flat[8]["steps"] == 2000 and flat[8]["steps_of"] == "every"
    assert fm.sync_of({"grad_sync": "delayed_grid", "compression": "fp16", "delay_compensation": "local"}) == (
        fm.Mode.parse("delayed_grid+fp16+comp").sync
    )
    assert fm.sync_of({"grad_sync": "periodic", "sync_period": 8}) == fm.Mode.parse("periodic8").sync
    assert fm.sync_of({"grad_sync": "every", "compression": "fp16"}) == fm.Mode.parse("fp16").sync == "every"
    with pytest.raises(ConfigError, match="no run with k = 1 and sync every"):
        fm.time_to_quality({**STEPS, "runs": [{**r, "sync": "delayed"} for r in STEPS["runs"]]}, S, f, "33", mode)


def test_periodic_copies_are_what_a_periodic_sync_averages():
    """The model prices a periodic sync at PERIODIC_COPIES gradients: what ``PeriodicAveraging`` allreduces with
    base.json's optimizer (Adam's two moments and the Ema parameter average beside the parameters)."""
    from hvd_ngp.training.gradsync import PeriodicAveraging
    from hvd_ngp.training.optim import Adam, ParameterEma

    field = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    opt = Adam([{"params": list(field.parameters())}], lr=1e-2)
    field(torch.randn(5, 4)).sum().backward()
    opt.step()
    ema = ParameterEma(list(field.named_parameters()), 0.95)
    sync = PeriodicAveraging(field, opt, 8, ema)
    grad_bytes = sum(p.numel() * 4 for p in field.parameters())
    assert sum(t.numel() * t.element_size() for t in sync.tensors()) == fm.PERIODIC_COPIES * grad_bytes


def test_bench_fabric_prices_shared_device_steps_at_its_own_step(tmp_path, capsys):
    """Runs that shared a device (bench batch --parallel) give steps, not step times: each step is priced at
    --step_ms."""
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps({**STEPS, "step_ms_per_backward_pass": 99.0, "shared_device": True}))
    result = fabric_bench.main(["--step_ms", "3.0", "--grad_mib", "46.5", "--preset", "ib4", "--steps_json",
                                str(steps), "--psnr", "33", "--ttq_modes", "flat"])  # fmt: skip
    one = next(r for r in result["time_to_psnr"] if r["ranks"] == 1)
    assert one["step_ms"] == 3.0 and one["time_s"] == pytest.approx(8200 * 3.0 / 1e3)
    assert "shared one device" in capsys.readouterr().out
