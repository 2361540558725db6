"""The fused Triton MLP against its torch twin (``make_mlp``'s ``nn.Sequential``), and the row count
(``n_rows``) of the fused MLP, the Triton hash grid, the field and the fast renderer's density pass.

On a GPU the kernels run compiled; without one under Triton's interpreter (conftest sets
TRITON_INTERPRET=1), with small problems. The sm_90 compile check of these kernels is in
``tests/test_kernels.py`` (``exercise_kernels``).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from hvd_ngp.errors import ConfigError
from hvd_ngp.model.encoding.hashgrid import MERGE_RUNS_BELOW, HashGridSpec
from hvd_ngp.model.field import NGPField, make_mlp
from hvd_ngp.triton_support import triton_available

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")

if not triton_available(DEV.type):
    if os.environ.get("HVD_NGP_REQUIRE_GPU") == "1":
        pytest.fail("HVD_NGP_REQUIRE_GPU=1 but the Triton kernels cannot run here", pytrace=False)
    pytest.skip("Triton is not installed (or no GPU and no interpreter)", allow_module_level=True)

from interpreter_checks import poisoned_memory  # noqa: E402

from hvd_ngp.model.encoding.hashgrid_triton import HashGridTriton  # noqa: E402
from hvd_ngp.model.mlp_triton import FusedMLP, autocast_dot, fused_mlp  # noqa: E402

SMALL = DEV.type == "cpu"
#: (n_input, block) of the two MLPs of the default config, then generic shapes: padded input and
#: output (8 -> 16, 5 -> 16), width 16 and 128, three hidden layers, no activation
DENSITY = (32, {"n_neurons": 64, "n_hidden_layers": 1}, 16)
COLOUR = (32, {"n_neurons": 128, "n_hidden_layers": 2}, 3)  # base.json's colour MLP (instant-ngp's is 64 wide)
GENERIC = [
    (8, {"n_neurons": 16, "n_hidden_layers": 3}, 5),
    (24, {"n_neurons": 128, "n_hidden_layers": 1}, 1),
    (32, {"n_neurons": 64, "n_hidden_layers": 2}, 3),
    (32, {"n_neurons": 32, "n_hidden_layers": 2, "activation": "None"}, 16),
]
ROWS = [0, 1, 70, 300] if SMALL else [0, 1, 1000, 1 << 16]  # several row blocks per program on the interpreter


def mlp(n_in: int, block: dict, n_out: int, seed: int = 0) -> FusedMLP:
    torch.manual_seed(seed)
    m = make_mlp({**block, "fused": True}, n_in, n_out, "network", backend="triton").to(DEV)
    assert isinstance(m, FusedMLP)
    return m


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (0 for empty tensors)."""
    a, b = a.detach().float(), b.detach().float()
    return 0.0 if b.numel() == 0 else float((a - b).norm() / b.norm().clamp(min=1e-12))


def run(m: torch.nn.Module, x: torch.Tensor, g: torch.Tensor, fn) -> tuple[torch.Tensor, torch.Tensor, list]:
    """fn(x) (output), and the gradients of (output * g).sum() in x and every parameter of m."""
    x = x.clone().requires_grad_(True)
    m.zero_grad(set_to_none=True)
    y = fn(x)
    (y.float() * g).sum().backward()
    return y, x.grad, [p.grad for p in m.parameters()]


@pytest.mark.parametrize(
    "shape", [DENSITY, COLOUR, *GENERIC], ids=["density", "colour", "w16d3", "w128", "colour64", "linear"]
)
@pytest.mark.parametrize("n", ROWS)
def test_fused_mlp_fp32_matches_torch(shape, n):
    """fp32 math ("ieee": what torch's fp32 matmul computes), output and every gradient."""
    n_in, block, n_out = shape
    m = mlp(n_in, block, n_out)
    x = torch.randn(n, n_in, device=DEV)
    g = torch.randn(n, n_out, device=DEV)
    y, gx, gw = run(m, x, g, m)
    y_ref, gx_ref, gw_ref = run(m, x, g, m.reference)
    assert y.dtype == torch.float32 and y.shape == (n, n_out)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(gw, gw_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    if n == 0:
        assert all(float(a.abs().sum()) == 0 for a in gw)


@pytest.mark.parametrize("n", ROWS[2:])
def test_fused_mlp_reads_and_writes_a_column_major_input(n):
    """The input as the hash grid lays it out (the transpose of a contiguous ``[K, N]``): the same output and
    gradients as a row-major copy, and the input's gradient comes back in the input's layout; with a row
    count too."""
    n_in, block, n_out = DENSITY
    m = mlp(n_in, block, n_out)
    x_cols = torch.randn(n_in, n, device=DEV).t()
    assert x_cols.stride() == (1, n)
    g = torch.randn(n, n_out, device=DEV)
    for count in (None, max(n // 2, 1)):

        def fn(x):
            return m(x) if count is None else m(x, torch.tensor(count, device=DEV))

        x = x_cols.clone().requires_grad_(True)  # a column-major leaf (clone keeps the strides)
        m.zero_grad(set_to_none=True)
        y = fn(x)
        (y.float() * g).sum().backward()
        gw = [p.grad.clone() for p in m.parameters()]  # before run() below zeroes and refills p.grad
        y_ref, gx_ref, gw_ref = run(m, x_cols.contiguous(), g, fn)
        assert x.grad.stride() == (1, n)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(x.grad, gx_ref, rtol=1e-5, atol=1e-6)
        for a, b in zip(gw, gw_ref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [DENSITY, COLOUR, GENERIC[0]], ids=["density", "colour", "w16d3"])
@pytest.mark.parametrize("n", ROWS)
def test_fused_mlp_fp16_matches_torch_autocast(shape, n):
    """Under fp16 autocast the fused MLP runs half inputs with fp32 accumulation and returns half, like
    ``nn.Linear`` under autocast: output and gradients within half-precision rounding of the autocast
    twin, the output also of fp32. (The gradients of both half paths stray up to ~1e-1 from fp32's,
    wherever rounding flips a ReLU: compared with the twin only.)"""
    n_in, block, n_out = shape
    m = mlp(n_in, block, n_out)
    x = torch.randn(n, n_in, device=DEV)
    g = torch.randn(n, n_out, device=DEV)

    def autocast(fn):
        def f(x):
            with torch.autocast(DEV.type, dtype=torch.float16):
                return fn(x)

        return f

    y, gx, gw = run(m, x, g, autocast(m))
    y_half, gx_half, gw_half = run(m, x, g, autocast(m.reference))
    y_ref = m.reference(x)
    assert y.dtype == torch.float16 and gx.dtype == torch.float32 and all(a.dtype == torch.float32 for a in gw)
    assert rel_err(y, y_ref) < 3e-3
    for a, b in zip([y, gx, *gw], [y_half, gx_half, *gw_half]):
        assert rel_err(a, b) < 2e-3


@pytest.mark.parametrize("degree,g,n", [(4, 16, 300), (3, 7, 70), (1, 15, 1)])
def test_fused_mlp_computes_the_sh_input_in_its_kernel(degree, g, n):
    """``FusedMLP.forward_sh(d, geo, degree)``: the MLP of ``SphericalHarmonics.concat(d, geo)`` (torch twins of
    both), rows past ``n_rows`` zeros, in fp16 within half rounding; refused with gradients or another width."""
    from hvd_ngp.model.encoding.sh import SphericalHarmonics
    from hvd_ngp.triton_support import inference_math

    m = mlp(degree * degree + g, {"n_neurons": 32, "n_hidden_layers": 2}, 3)
    d = torch.nn.functional.normalize(torch.randn(n, 3, device=DEV), dim=-1)
    geo = torch.randn(n, g, device=DEV)
    with torch.no_grad():
        ref = m.reference(SphericalHarmonics(degree).concat(d, geo))
        out = m.forward_sh(d, geo, degree)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        cut = m.forward_sh(d, geo, degree, torch.tensor(n // 2, device=DEV))
        torch.testing.assert_close(cut[: n // 2], ref[: n // 2], rtol=1e-4, atol=1e-5)
        assert not cut[n // 2 :].any()
        with inference_math("fp16"):
            half = m.forward_sh(d, geo.half(), degree)
        assert half.dtype == torch.float16 and rel_err(half, ref) < 3e-3
        with pytest.raises(ValueError, match=f"degree {degree} and {g + 1} features"):
            m.forward_sh(d, torch.randn(n, g + 1, device=DEV), degree)
    with pytest.raises(RuntimeError, match="without gradients"):
        m.forward_sh(d, geo, degree)


def test_a_field_colours_through_the_sh_kernel_without_gradients_only():
    """``NGPField.colour`` on the triton backend: without gradients through ``FusedMLP.forward_sh``, with them
    through the SH concat and the MLP (training); the same colours either way."""
    from conftest import TINY_ARGS

    from hvd_ngp.config import CPU_CONFIG, parse_args

    model = parse_args(["--config", str(CPU_CONFIG), *TINY_ARGS], default_config=CPU_CONFIG).model
    torch.manual_seed(0)
    field = NGPField(model, torch.tensor([[0.0] * 3, [1.0] * 3]), "triton").to(DEV)
    calls: list[int] = []
    fused = field.rgb_mlp.forward_sh
    field.rgb_mlp.forward_sh = lambda d, geo, *rest: calls.append(d.shape[0]) or fused(d, geo, *rest)
    x, d = torch.rand(90, 3, device=DEV), torch.nn.functional.normalize(torch.randn(90, 3, device=DEV), dim=-1)
    trained = field(x, d)[0]
    assert calls == [] and trained.requires_grad
    with torch.no_grad():
        rendered = field(x, d)[0]
    assert calls == [90]
    torch.testing.assert_close(rendered, trained.detach(), rtol=1e-4, atol=1e-5)


def test_fused_mlp_precision_follows_autocast_and_tf32():
    assert autocast_dot(DEV.type) == "ieee"
    with torch.autocast(DEV.type, dtype=torch.float16):
        assert autocast_dot(DEV.type) == "fp16"
    with torch.autocast(DEV.type, dtype=torch.bfloat16):
        assert autocast_dot(DEV.type) == "bf16"
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert autocast_dot("cuda") == "tf32" and autocast_dot("cpu") == "ieee"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_inference_math_context_picks_the_math_outside_autocast_only_in_its_context():
    """``triton_support.inference_math``: inside, CUDA's fp32 math is the context's (whatever torch's tf32 flag
    says) and "fp16" holds on any device; autocast still wins; the CPU stays ieee under tf32; other threads and
    the code after it see the flag again."""
    import threading

    from hvd_ngp.triton_support import inference_math

    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        with inference_math("tf32"):
            assert autocast_dot("cuda") == "tf32" and autocast_dot("cpu") == "ieee"
            with torch.autocast(DEV.type, dtype=torch.bfloat16):
                assert autocast_dot(DEV.type) == "bf16"
            seen = []
            t = threading.Thread(target=lambda: seen.append(autocast_dot("cuda")))
            t.start()
            t.join()
            assert seen == ["ieee"]  # a thread beside it (training beside the viewer) keeps torch's flag
            torch.backends.cuda.matmul.allow_tf32 = True
            with inference_math("ieee"):
                assert autocast_dot("cuda") == "ieee"
            with inference_math("fp16"):
                assert autocast_dot("cuda") == "fp16" and autocast_dot("cpu") == "fp16"
            assert autocast_dot("cuda") == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = False
        assert autocast_dot("cuda") == "ieee"
        with pytest.raises(ValueError, match="inference math"):
            with inference_math("bf16"):
                pass
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("dot", ["tf32", "bf16"])
def test_fused_mlp_tf32_and_bf16_on_gpu(dot):
    """tf32 (10-bit mantissa products) and bf16 (8-bit) against fp32; the interpreter has no bf16 dot
    (it multiplies the raw bits), so these run on a GPU only (their sm_90 compile check runs anywhere)."""
    if DEV.type != "cuda":
        pytest.skip("the Triton interpreter computes no tf32 or bf16 products")
    m = mlp(*COLOUR)
    x = torch.randn(5000, 32, device=DEV)
    w = [p for p in m.parameters()]
    ref = m.reference(x)
    tol = 3e-3 if dot == "tf32" else 2e-2
    assert rel_err(fused_mlp(x, w, dot=dot), ref) < tol


def test_a_block_the_device_cannot_hold_is_halved_until_it_fits(monkeypatch):
    """launch_fitting: a compiler refusal (OutOfResources, as the H100 gave the 128-wide fp32 backward at 64 rows)
    halves the row block; the block that fitted is remembered for the next launch; below the smallest block the
    refusal is raised."""
    import triton

    from hvd_ngp.model import mlp_triton

    launched = []

    class Kernel:  # stands in for a jitted kernel: refuses blocks above `fits` like the compiler would
        fn = type("fn", (), {"__name__": "fake"})
        fits = 32

        def __getitem__(self, grid):
            def launch(*args, BLOCK, num_warps, **constexprs):
                if BLOCK > self.fits:
                    raise triton.runtime.errors.OutOfResources(BLOCK * 4096, 232448, "shared memory")
                launched.append((grid, BLOCK, constexprs))

            return launch

    monkeypatch.setattr(mlp_triton, "_FITTED_BLOCK", {})
    kernel = Kernel()
    assert mlp_triton.launch_fitting(kernel, 1000, 128, torch.device("cpu"), (), {"H": 128}, 4) == 32
    assert launched[-1][1] == 32 and launched[-1][2] == {"H": 128}
    assert mlp_triton.launch_fitting(kernel, 1000, 128, torch.device("cpu"), (), {"H": 128}, 4) == 32
    assert len(launched) == 2  # the second launch went straight to the block that fitted
    assert mlp_triton.launch_fitting(kernel, 1000, 128, torch.device("cpu"), (), {"H": 64}, 4) == 32  # other key
    kernel.fits = 8
    with pytest.raises(triton.runtime.errors.OutOfResources):
        mlp_triton.launch_fitting(kernel, 1000, 64, torch.device("cpu"), (), {"H": 16}, 4)


def test_the_row_block_is_chosen_from_the_shared_memory_limit():
    """fitting_block: the largest of block, block / 2, ... whose shared memory fits the device's limit (the H100's
    232448 bytes against the 256 KiB the 128-wide fp32 backward needed at 64 rows); no limit (CPU): the block as
    asked; nothing fits: OutOfResources with the smallest block's need. The CPU has no limit."""
    import triton

    from hvd_ngp.model import mlp_triton

    need = {64: 262144, 32: 131072, 16: 65536}.__getitem__
    assert mlp_triton.fitting_block(64, need, 232448) == 32
    assert mlp_triton.fitting_block(64, need, 262144) == 64  # exactly the limit fits
    assert mlp_triton.fitting_block(64, need, None) == 64
    with pytest.raises(triton.runtime.errors.OutOfResources) as refused:
        mlp_triton.fitting_block(64, need, 60000)
    assert (refused.value.required, refused.value.limit) == (65536, 60000)
    assert mlp_triton.max_shared_memory(torch.device("cpu")) is None


def test_a_cuda_launch_compiles_to_choose_its_block_before_launching(monkeypatch):
    """launch_fitting on a CUDA device: candidates are compiled (warmup) and measured against the device's shared
    memory before any launch, so the first launch is already at a block that fits (no refused launch); the
    choice is remembered (no compiling again)."""
    import triton

    from hvd_ngp.model import mlp_triton

    compiled, launched = [], []

    class Kernel:  # a jitted kernel's surface: warmup compiles and reports shared memory, [grid] launches
        fn = type("fn", (), {"__name__": "fake_cuda"})

        def warmup(self, *args, BLOCK, num_warps, grid, **constexprs):
            compiled.append(BLOCK)
            return type("compiled", (), {"metadata": type("meta", (), {"shared": BLOCK * 4096})})

        def __getitem__(self, grid):
            def launch(*args, BLOCK, num_warps, **constexprs):
                if BLOCK * 4096 > 232448:
                    raise triton.runtime.errors.OutOfResources(BLOCK * 4096, 232448, "shared memory")
                launched.append(BLOCK)

            return launch

    monkeypatch.setattr(mlp_triton, "_FITTED_BLOCK", {})
    monkeypatch.setattr(mlp_triton, "max_shared_memory", lambda device: 232448)
    monkeypatch.setattr(mlp_triton, "programs", lambda n, block, device: 1)
    cuda = torch.device("cuda", 0)
    assert mlp_triton.launch_fitting(Kernel(), 1000, 128, cuda, (), {"H": 128}, 4) == 32
    assert compiled == [128, 64, 32] and launched == [32]
    assert mlp_triton.launch_fitting(Kernel(), 1000, 128, cuda, (), {"H": 128}, 4) == 32
    assert compiled == [128, 64, 32] and launched == [32, 32]


def test_state_dict_is_the_torch_twins():
    """The fused MLP has the nn.Sequential's parameters, names and shapes: snapshots move both ways,
    and the same seed initialises both the same."""
    for n_in, block, n_out in (DENSITY, COLOUR):
        torch.manual_seed(3)
        ref = make_mlp(block, n_in, n_out, "network", backend="torch")
        torch.manual_seed(3)
        fused = make_mlp({**block, "fused": True}, n_in, n_out, "network", backend="triton")
        assert type(ref) is torch.nn.Sequential and isinstance(fused, FusedMLP)
        sd, sd_fused = ref.state_dict(), fused.state_dict()
        assert list(sd) == list(sd_fused) and all(torch.equal(sd[k], sd_fused[k]) for k in sd)
        assert [p.shape for p in ref.parameters()] == [p.shape for p in fused.parameters()]
        torch.nn.init.normal_(ref[0].weight)
        fused.load_state_dict(ref.state_dict())
        ref.load_state_dict(fused.state_dict())
        assert torch.equal(fused[0].weight, ref[0].weight)


def test_make_mlp_fused_switch():
    block = {"n_neurons": 64, "n_hidden_layers": 2, "fused": True}
    assert isinstance(make_mlp(block, 32, 3, "rgb_network", backend="triton"), FusedMLP)
    inference_only = make_mlp({"n_neurons": 64}, 32, 3, "rgb_network", backend="triton")  # training fused: opt-in
    assert isinstance(inference_only, FusedMLP) and not inference_only.train_fused
    assert make_mlp(block, 32, 3, "rgb_network", backend="triton").train_fused
    # the trainer's default under bf16/fp16 (fused_training); a block's own "fused" wins either way
    assert make_mlp({"n_neurons": 64}, 32, 3, "rgb_network", backend="triton", fused_training=True).train_fused
    assert not make_mlp(
        {**block, "fused": False}, 32, 3, "rgb_network", backend="triton", fused_training=True
    ).train_fused
    assert type(make_mlp(block, 32, 3, "rgb_network", backend="torch")) is torch.nn.Sequential
    # shapes the kernels do not take stay on nn.Linear
    for unfused in (
        {"n_neurons": 48},
        {"n_neurons": 64, "n_hidden_layers": 4},
        {"n_neurons": 64, "n_hidden_layers": 0},
    ):
        assert type(make_mlp(unfused, 32, 3, "rgb_network", backend="triton")) is torch.nn.Sequential
    with pytest.raises(ConfigError, match="fused must be true or false"):
        make_mlp({**block, "fused": "no"}, 32, 3, "rgb_network", backend="triton")


@pytest.mark.parametrize("count_dtype", [torch.int32, torch.int64])
def test_fused_mlp_skips_rows_past_the_count(count_dtype):
    """With n_rows, rows < n equal the full computation, rows >= n stay zero (forward and input
    gradient), and the weight gradients are those of the first n rows alone."""
    m = mlp(*COLOUR)
    n_total = 300 if SMALL else 5000
    x = torch.randn(n_total, 32, device=DEV)
    g = torch.randn(n_total, 3, device=DEV)
    full, gx_full, _ = run(m, x, g, m)
    for n in (0, 37, n_total, n_total + 5):
        count = torch.tensor(n, device=DEV, dtype=count_dtype)
        y, gx, gw = run(m, x, g, lambda x: m(x, count))
        k = min(n, n_total)
        torch.testing.assert_close(y[:k], full[:k], rtol=1e-5, atol=1e-6)
        assert bool((y[k:] == 0).all()) and bool((gx[k:] == 0).all())
        torch.testing.assert_close(gx[:k], gx_full[:k], rtol=1e-5, atol=1e-6)
        _, _, gw_part = run(m, x[:k], g[:k], m)
        for a, b in zip(gw, gw_part):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # the density pass: inference, no graph
        y = m(x, torch.tensor(37, device=DEV))
    assert torch.equal(y[:37], full[:37].detach()) and bool((y[37:] == 0).all())


def test_hashgrid_skips_rows_past_the_count():
    spec = HashGridSpec(4, 2, 10, 8, 2.0)
    torch.manual_seed(1)
    # the interpreter walks the merged backward's scan element by element: merging has its own count test
    enc = HashGridTriton(spec, merge_runs_below=0 if SMALL else MERGE_RUNS_BELOW).to(DEV)
    with torch.no_grad():
        enc.params.normal_()
    n_total = 300 if SMALL else 5000
    x = torch.rand(n_total, 3, device=DEV)
    g = torch.randn(n_total, spec.n_output_dims, device=DEV)
    full = enc(x)
    for n, dtype in ((0, torch.int64), (129, torch.int32), (200, torch.int64), (n_total + 3, torch.int64)):
        k = min(n, n_total)
        enc.zero_grad(set_to_none=True)
        with poisoned_memory():  # the kernel writes the zeros past the count itself (no zero fill first)
            out = enc(x, torch.tensor(n, device=DEV, dtype=dtype))
        (out * g).sum().backward()
        assert torch.equal(out[:k], full[:k]) and bool((out[k:] == 0).all())
        grad = enc.params.grad.clone()
        enc.zero_grad(set_to_none=True)
        (enc(x[:k]) * g[:k]).sum().backward()
        torch.testing.assert_close(grad, enc.params.grad, rtol=1e-5, atol=1e-6)


TINY_MODEL = {
    "encoding": {
        "otype": "HashGrid",
        "n_levels": 4,
        "n_features_per_level": 2,
        "log2_hashmap_size": 10,
        "base_resolution": 8,
        "desired_resolution": 64,
    },
    "network": {"n_neurons": 32, "n_hidden_layers": 1, "n_output_dims": 16, "fused": True},
    "dir_encoding": {"otype": "SphericalHarmonics", "degree": 4},
    "rgb_network": {"n_neurons": 32, "n_hidden_layers": 2, "fused": True},
}


def test_field_on_triton_fuses_both_mlps_and_skips_rows():
    aabb = torch.tensor([[0.0] * 3, [1.0] * 3], device=DEV)
    torch.manual_seed(0)
    field = NGPField(TINY_MODEL, aabb, "triton").to(DEV)
    torch.manual_seed(0)
    ref = NGPField(TINY_MODEL, aabb, "torch").to(DEV)
    assert isinstance(field.density_mlp, FusedMLP) and isinstance(field.rgb_mlp, FusedMLP)
    ref.load_state_dict(field.state_dict())  # the snapshot of a fused field loads into the reference
    x = torch.rand(200, 3, device=DEV)
    d = torch.nn.functional.normalize(torch.randn(200, 3, device=DEV), dim=-1)
    rgb, sigma = field(x, d)
    rgb_ref, sigma_ref = ref(x, d)
    torch.testing.assert_close(rgb, rgb_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sigma, sigma_ref, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        sigma_part, geo = field.query_density(x, torch.tensor(77, device=DEV))
    torch.testing.assert_close(sigma_part[:77], sigma_ref[:77].detach(), rtol=1e-4, atol=1e-4)
    assert bool((geo[77:] == 0).all()) and bool((sigma_part[77:] == 1).all())  # zero features: exp(0)
    with torch.no_grad():  # backends without the kernels compute every row
        torch.testing.assert_close(ref.query_density(x, torch.tensor(77, device=DEV))[0], sigma_ref.detach())
    # the network pass of a training step: rows < n as the full field, and the gradients of those rows alone
    field.zero_grad(set_to_none=True)
    rgb_part, sigma_part = field(x, d, torch.tensor(77, device=DEV))
    torch.testing.assert_close(rgb_part[:77], rgb[:77].detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sigma_part[:77], sigma[:77].detach(), rtol=1e-5, atol=1e-5)
    (rgb_part[:77].sum() + sigma_part[:77].sum() + 0 * (rgb_part.sum() + sigma_part.sum())).backward()
    grads = [p.grad.clone() for p in field.parameters()]
    field.zero_grad(set_to_none=True)
    rgb_first, sigma_first = field(x[:77], d[:77])
    (rgb_first.sum() + sigma_first.sum()).backward()
    for a, p in zip(grads, field.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-5)


def test_fast_renderer_density_pass_reads_only_filled_slots():
    """The renderer's density pass gets the packed count and its network pass the kept count: a field that is
    NaN at every row past them (and at every slot of an empty buffer tail) still renders exactly the
    reference image."""
    from hvd_ngp.cluster import dist
    from hvd_ngp.render import StepSchedule, render_rays
    from hvd_ngp.render.fast import FastRenderer
    from hvd_ngp.render.occupancy import OccupancyGrid

    dist.init("cpu" if DEV.type == "cpu" else "cuda")
    aabb = torch.tensor([[0.0] * 3, [1.0] * 3], device=DEV)
    grid = OccupancyGrid(aabb, 8, 1).to(DEV)
    grid.occupied.fill_(True)
    sch = StepSchedule.uniform(3**0.5 / 48)
    gen = torch.Generator().manual_seed(4)
    o = torch.tensor([0.5] * 3) + 2.0 * torch.nn.functional.normalize(torch.randn(16, 3, generator=gen), dim=-1)
    d = torch.nn.functional.normalize(torch.tensor([0.5] * 3) + 0.3 * torch.randn(16, 3, generator=gen) - o, dim=-1)
    o, d = o.to(DEV), d.to(DEV)
    centre = torch.tensor([0.5] * 3, device=DEV)
    counts = []

    def ball(x):
        return 40.0 * torch.sigmoid(20 * (0.3 - (x - centre).norm(dim=-1)))

    def sigma_fn(x, n_rows=None):
        s = ball(x)
        if n_rows is not None:
            counts.append(int(n_rows))
            s = torch.where(torch.arange(x.shape[0], device=DEV) < n_rows, s, float("nan"))
        return s

    rows = []

    def rgb_sigma_fn(x, dirs, n_rows=None):
        rgb, s = torch.stack([x[:, 0], x[:, 1], dirs[:, 2].abs()], dim=-1), ball(x)
        if n_rows is not None:  # the network pass: rows past the kept samples are not read either
            rows.append(int(n_rows))
            past = torch.arange(x.shape[0], device=DEV) >= n_rows
            rgb, s = rgb.masked_fill(past[:, None], float("nan")), s.masked_fill(past, float("nan"))
        return rgb, s

    ref = render_rays(rgb_sigma_fn, ball, o, d, aabb, grid, sch, 1e-3, None)
    out = FastRenderer(ref.n_candidates + 500, 4096)(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, sch, 1e-3, None)
    assert counts == [ref.n_candidates] and int(out.n_candidates) == ref.n_candidates
    assert rows == [ref.n_samples] and ref.n_samples < 4096
    assert bool(out.valid.all()) and int(out.n_samples) == ref.n_samples
    torch.testing.assert_close(out.rgb, ref.rgb, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.opacity, ref.opacity, rtol=1e-4, atol=1e-5)


def test_training_step_with_fused_mlps_matches_nn_linear(scene_cache, tmp_path):
    """One training step on the triton backend (fast renderer, density pass with the filled-slot count,
    fused MLPs) against the same step with both MLPs on nn.Linear ("fused": false): the same loss and
    MLP gradients (the hash-grid atomics and the kernels' summation order aside)."""
    if DEV.type != "cpu":
        pytest.skip("the tiny CPU trainer; on a GPU the parity tests above cover the kernels")
    from conftest import INTERPRETER_ARGS, tiny_cpu_args

    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    off, on = '{"n_neurons": 16, "fused": false}', '{"n_neurons": 16, "fused": true}'
    unfused = ["--density_network", off, "--rgb_network", off]
    fused = ["--density_network", on, "--rgb_network", on]
    results = []
    for extra in (fused, unfused):
        tr = Trainer.build(
            parse_args(
                tiny_cpu_args(
                    scene_cache,
                    tmp_path / str(len(results)),
                    "--n_steps",
                    "1",
                    "--backend",
                    "triton",
                    *INTERPRETER_ARGS,
                    *extra,
                )
            )
        )
        assert tr.field.density_mlp.train_fused == (extra is fused)
        res, _ = tr.step(0)
        results.append((float(res.loss), int(res.n_samples), [p.grad.clone() for p in tr.field.mlp_parameters()]))
    (loss, n, grads), (loss_ref, n_ref, grads_ref) = results
    assert n == n_ref > 0 and loss == pytest.approx(loss_ref, rel=1e-5)
    for a, b in zip(grads, grads_ref):
        assert rel_err(a, b) < 1e-4


def test_inference_only_fused_mlp_trains_on_the_torch_twin():
    """Without "fused": true, passes that record gradients are the nn.Sequential's (bit for bit), passes
    without gradients the fused forward kernel, which leaves rows past n_rows at zero."""
    n_in, block, n_out = DENSITY
    m = make_mlp(block, n_in, n_out, "network", backend="triton").to(DEV)
    assert isinstance(m, FusedMLP) and not m.train_fused
    x = torch.randn(70, n_in, device=DEV)
    assert torch.equal(m(x), m.reference(x))
    with torch.no_grad():
        n = torch.tensor(40, device=DEV)
        out = m(x, n)
        ref = m.reference(x)
    assert rel_err(out[:40], ref[:40]) < 1e-4 and torch.count_nonzero(out[40:]) == 0


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_xavier_initialization_draws_each_matrix_within_its_bound(backend):
    """``"initialization": "xavier"``: every weight uniform in +-sqrt(6 / (fan_in + fan_out)), reaching
    near its bound (torch's default stays within 1/sqrt(fan_in), below the Xavier bound for these shapes);
    an unknown name is an error naming the block."""
    torch.manual_seed(0)
    xavier = make_mlp(
        {"n_neurons": 64, "n_hidden_layers": 2, "initialization": "xavier"}, 32, 16, "rgb_network", backend=backend
    )
    default = make_mlp({"n_neurons": 64, "n_hidden_layers": 2}, 32, 16, "rgb_network", backend=backend)
    for w, w0 in zip([p for p in xavier.parameters()], [p for p in default.parameters()]):
        fan_out, fan_in = w.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound
        assert w0.abs().max() <= 1 / math.sqrt(fan_in) < 0.95 * bound
    with pytest.raises(ConfigError, match="config: rgb_network.initialization 'he' is unknown \\(torch, xavier\\)"):
        make_mlp({"initialization": "he"}, 32, 3, "rgb_network")
