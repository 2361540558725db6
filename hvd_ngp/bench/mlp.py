"""``python -m hvd_ngp.bench mlp``: the fused Triton MLPs against torch eager, at ``--points`` rows.

The density MLP (``network`` block: encoding features -> width -> n_output_dims) and the colour MLP
(``rgb_network``: SH + geometry features -> width x 2 -> 3) of the config, each forward alone (no
graph) and forward+backward (gradients in the input and the weights), per implementation: torch
eager (``nn.Linear``) fp32 and under fp16/bf16 autocast, the fused kernels in ieee fp32, tf32, fp16
and bf16. Then the density pass of the training step (hash grid + density MLP, no gradients) on all
``--points`` rows against the same launch told that only ``--fill`` of them are filled (``n_rows``).
Milliseconds per call (mean over ``--repeat`` after warm-up, synchronised once around the loop).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..cluster import dist
from ..config import BASE_CONFIG, CPU_CONFIG, parse_settings
from ..model.encoding import make_position_encoding
from ..model.field import make_mlp
from ..options import options_from
from ..triton_support import triton_available
from .report import append_markdown, table, write_json
from .throughput import timed

#: (implementation, autocast dtype or None, fused math or None)
VARIANTS = [
    ("torch eager fp32", None, None),
    ("torch eager fp16 autocast", torch.float16, None),
    ("torch eager bf16 autocast", torch.bfloat16, None),
    ("triton fused fp32 (ieee)", None, "ieee"),
    ("triton fused tf32", None, "tf32"),
    ("triton fused fp16 autocast", torch.float16, "fp16"),
    ("triton fused bf16 autocast", torch.bfloat16, "bf16"),
]


@dataclass(frozen=True)
class MlpOptions:
    """The command line of ``python -m hvd_ngp.bench mlp`` (``main``'s parser holds each option's help)."""

    config: str | None
    device: str
    points: int
    fill: float
    repeat: int
    json: str
    markdown: str


def bench_one(name: str, block: dict, n_in: int, n_out: int, opts: MlpOptions, dev: torch.device) -> list[dict]:
    """Forward and forward+backward ms of one MLP shape, per variant."""
    torch.manual_seed(0)
    backend = "triton" if triton_available(dev.type) else "torch"
    fused = make_mlp({**block, "fused": True}, n_in, n_out, name, backend=backend).to(dev)
    assert isinstance(fused, torch.nn.Sequential)  # the torch and triton backends build one (FusedMLP is one)
    ref = torch.nn.Sequential(*fused)  # the same modules, computed by nn.Linear
    x = torch.randn(opts.points, n_in, device=dev, requires_grad=True)
    g = torch.randn(opts.points, n_out, device=dev)
    rows: list[dict[str, Any]] = []
    for label, autocast, dot in VARIANTS:
        if dot is not None and not hasattr(fused, "reference"):
            continue  # no Triton here, or a shape the kernels do not take
        if dev.type == "cpu" and (autocast is not None or dot == "tf32"):
            continue
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dot == "tf32"
        net = ref if dot is None else fused

        def context():
            return torch.autocast(dev.type, dtype=autocast or torch.float32, enabled=autocast is not None)

        def fwd():
            with torch.no_grad(), context():
                net(x)

        def fwd_bwd():
            x.grad = None
            net.zero_grad(set_to_none=True)
            with context():
                y = net(x)
            y.backward(g.to(y.dtype))

        try:
            rows.append(
                {
                    "mlp": f"{name} {n_in}-{block.get('n_neurons', 64)}x{block.get('n_hidden_layers', 1)}-{n_out}",
                    "implementation": label,
                    "fwd_ms": timed(fwd, dev, opts.repeat),
                    "fwd_bwd_ms": timed(fwd_bwd, dev, opts.repeat),
                }
            )
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
    base = {r["mlp"]: r for r in rows if r["implementation"] == "torch eager fp32"}
    for r in rows:
        r["fwd_bwd_speedup"] = base[r["mlp"]]["fwd_bwd_ms"] / r["fwd_bwd_ms"]
    return rows


def bench_density_pass(model: dict, opts: MlpOptions, dev: torch.device) -> list[dict]:
    """Hash grid + density MLP without gradients on all rows, and with ``n_rows`` = fill x rows."""
    if not triton_available(dev.type):
        return []
    enc = make_position_encoding(model["encoding"], "triton").to(dev)
    mlp = make_mlp(
        {**model["network"], "fused": True},
        enc.n_output_dims,
        int(model["network"].get("n_output_dims", 16)),
        "network",
        backend="triton",
    ).to(dev)
    x = torch.rand(opts.points, 3, device=dev)
    n_rows = torch.tensor(int(opts.fill * opts.points), device=dev)
    rows = []
    for label, count in (("all rows", None), (f"n_rows = {opts.fill:g} x rows", n_rows)):

        def density():
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.float16, enabled=dev.type == "cuda"):
                if count is None:
                    mlp(enc(x))
                else:
                    mlp(enc(x, count), count)

        rows.append({"density pass (fp16)": label, "ms": timed(density, dev, opts.repeat)})
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.bench mlp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default=None, help="trainer config (default: base.json on GPU, cpu.json on CPU)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--points", type=int, default=1 << 18, help="rows through each MLP")
    p.add_argument("--fill", type=float, default=0.5, help="filled share of the rows in the density pass")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--json", default="runs/bench/mlp.json")
    p.add_argument("--markdown", default="", help="also append a dated Markdown section to this file (default: none)")
    opts = options_from(MlpOptions, p.parse_args(argv))
    dev = dist.init(opts.device).device
    model = parse_settings(
        (["--config", opts.config] if opts.config else []) + ["--device", opts.device],
        default_config=BASE_CONFIG if opts.device != "cpu" else CPU_CONFIG,
    ).model.blocks
    enc = model["encoding"]
    n_enc = int(enc.get("n_levels", 16)) * int(enc.get("n_features_per_level", 2))
    n_geo = int(model["network"].get("n_output_dims", 16))
    n_dir = (int(model["dir_encoding"].get("degree", 4))) ** 2
    rows = bench_one("density", model["network"], n_enc, n_geo, opts, dev) + bench_one(
        "colour", model["rgb_network"], n_dir + n_geo, 3, opts, dev
    )
    density = bench_density_pass(model, opts, dev)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    shown = [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    parts = [
        f"Device: {device}; {opts.points} rows; {opts.repeat} timed calls each (ms per call).",
        table(shown, list(shown[0])),
    ]
    if density:
        parts.append(
            table(
                [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in density],
                list(density[0]),
            )
        )
    text = "\n\n".join(parts)
    print(text)
    result = {"device": device, "options": asdict(opts), "mlp": rows, "density_pass": density}
    if opts.json:
        write_json(opts.json, result)
    if opts.markdown:
        append_markdown(opts.markdown, "Fused MLPs", text, ["mlp", *(argv if argv is not None else [])])
    return result
