"""instant-ngp's training recipe: optimizer chain, decay boundary, parameter average, sparse Adam,
training rays at pixel centres, the ngp evaluation protocol."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_trainer

from hvd_ngp.cluster import dist
from hvd_ngp.config import CPU_CONFIG, parse_args
from hvd_ngp.data.sampler import RaySampler, image_rays
from hvd_ngp.data.scene import Frames
from hvd_ngp.errors import ConfigError
from hvd_ngp.training.optim import Adam, OptimizerChain, ParameterEma, exponential_decay

ADAM = {"otype": "Adam", "learning_rate": 1e-2}


def test_decay_applies_its_first_factor_at_decay_start_like_tiny_cuda_nn():
    block = {"decay_start": 100, "decay_interval": 10, "decay_base": 0.5, "decay_end": 125}
    factors = {s: exponential_decay(s, block) for s in (99, 100, 109, 110, 120, 125, 126, 1000)}
    assert factors == {99: 1.0, 100: 0.5, 109: 0.5, 110: 0.25, 120: 0.125, 125: 0.125, 126: 0.125, 1000: 0.125}
    assert exponential_decay(10**6, None) == 1.0


def test_unknown_optimizer_otype_is_an_error_naming_the_config():
    chain = OptimizerChain.parse(
        {"otype": "Ema", "decay": 0.9, "nested": {"otype": "ExponentialDecay", "nested": ADAM}}, "cfg.json"
    )
    assert chain.adam == ADAM and chain.ema["decay"] == 0.9 and chain.decay is not None
    for block in (
        {"otype": "Lookahead", "nested": ADAM},
        {"otype": "Ema", "nested": {"otype": "Shampoo"}},
        {"otype": "Ema", "nested": {"otype": "Ema", "nested": ADAM}},
    ):
        with pytest.raises(ConfigError, match="cfg.json"):
            OptimizerChain.parse(block, "cfg.json")


def test_ema_follows_tiny_cuda_nn_with_its_bias_correction():
    p = torch.nn.Parameter(torch.zeros(3))
    ema = ParameterEma([("p", p)], decay=0.9)
    raw = torch.zeros(3)
    for t, w in enumerate([1.0, 2.0, 4.0], start=1):
        with torch.no_grad():
            p.fill_(w)
        ema.update()
        raw = 0.9 * raw + 0.1 * w  # the debiased average is raw / (1 - d^t)
        torch.testing.assert_close(ema.average[0], raw / (1 - 0.9**t))
    # by hand: t=1: 1; t=2: (0.9*0.1*1 + 0.1*2)/0.19 = 1.5263; t=3: (0.9*0.19*1.5263 + 0.1*4)/0.271 = 2.4391
    assert ema.average[0][0].item() == pytest.approx(2.4391, abs=1e-4)
    with ema.swapped():
        assert torch.equal(p.detach(), ema.average[0])
    assert torch.equal(p.detach(), torch.full((3,), 4.0))


def test_sparse_adam_leaves_zero_gradient_entries_and_counts_steps_per_entry():
    torch.manual_seed(0)
    w0 = torch.randn(4)
    p = torch.nn.Parameter(w0.clone())
    opt = Adam([{"params": [p], "sparse": True}], lr=0.1, betas=(0.9, 0.99), eps=1e-15)
    grads = [torch.tensor([1.0, 0.0, -2.0, 0.0]), torch.tensor([0.5, 3.0, 0.0, 0.0])]
    # reference, entry by entry, as tiny-cuda-nn's adam_step for non-matrix parameters
    w, m, v, n = w0.clone(), torch.zeros(4), torch.zeros(4), [0] * 4
    for g in grads:
        p.grad = g.clone()
        opt.step()
        for i in range(4):
            if g[i] == 0:
                continue
            m[i] = 0.9 * m[i] + 0.1 * g[i]
            v[i] = 0.99 * v[i] + 0.01 * g[i] ** 2
            n[i] += 1
            lr = 0.1 * (1 - 0.99 ** n[i]) ** 0.5 / (1 - 0.9 ** n[i])
            w[i] = w[i] - lr * m[i] / (v[i].sqrt() + 1e-15)
    torch.testing.assert_close(p.detach(), w)
    assert p[3].item() == w0[3].item()  # never touched
    assert opt.state[p]["entry_steps"].tolist() == [2.0, 1.0, 1.0, 0.0]


def test_dense_groups_are_torch_adam():
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(5))
    b.data.copy_(a.data)
    ours, theirs = Adam([a], lr=0.01, betas=(0.9, 0.99)), torch.optim.Adam([b], lr=0.01, betas=(0.9, 0.99))
    for _ in range(3):
        g = torch.randn(5)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert torch.equal(a, b)


def centre_rays(frames: Frames, pixel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixel-centre rays of global pixel ids ``[R]``, picked from ``image_rays``: origins, directions."""
    img, y, x = frames.locate(pixel.cpu())
    o, d = torch.empty(len(pixel), 3), torch.empty(len(pixel), 3)
    for i in img.unique().tolist():
        on = img == i
        o_img, d_img = image_rays(frames, i, torch.device("cpu"))
        k = y[on] * frames.image_size(i)[0] + x[on]  # row-major in the image
        o[on], d[on] = o_img[k], d_img[k]
    return o, d


def test_training_rays_go_through_pixel_centres_unless_jitter_is_on():
    """Without --train_ray_jitter (the default) each drawn ray is its pixel's centre ray; with it, none is."""

    off = parse_args(["--config", str(CPU_CONFIG)])
    on = parse_args(["--config", str(CPU_CONFIG), "--train_ray_jitter", "on"])
    assert not off.data.train_ray_jitter and on.data.train_ray_jitter
    turn = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])  # two cameras, 90 degrees apart
    c2w = torch.stack(
        [
            torch.cat([torch.eye(3), torch.tensor([[0.0], [0.0], [-2.0]])], 1),
            torch.cat([turn, torch.tensor([[2.0], [0.5], [0.0]])], 1),
        ]
    )
    frames = Frames(
        torch.zeros(2, 6, 8, 4, dtype=torch.uint8), c2w, torch.tensor([[8.0, 8.0, 4.0, 3.0]] * 2), torch.zeros(2, 6)
    )
    for jitter in (False, True):
        sampler = RaySampler(frames, 0, 1, 0, torch.device("cpu"), jitter, prefetch=False)
        rays = sampler.sample(256)
        sampler.close()
        o, d = centre_rays(frames, rays.pixel)
        assert set(frames.locate(rays.pixel)[0].tolist()) == {0, 1}
        torch.testing.assert_close(rays.origins, o)
        if jitter:
            assert bool(((rays.directions - d).norm(dim=-1) > 1e-4).all())
        else:
            torch.testing.assert_close(rays.directions, d)


@pytest.fixture
def trained(tmp_path, scene_cache):
    tr = tiny_trainer(scene_cache, tmp_path / "o", 8)
    yield tr
    tr.data.close()
    dist.shutdown()


def test_built_sampler_uses_centres_and_evaluation_uses_the_average(trained):
    tr = trained
    assert tr.sampler.jitter is False
    rays = tr.sampler.sample(64)
    o, d = centre_rays(tr.sampler.frames, rays.pixel)
    torch.testing.assert_close(rays.origins.cpu(), o)
    torch.testing.assert_close(rays.directions.cpu(), d)
    ema = tr.state.ema
    assert ema is not None and ema.count == 8 and ema.decay == 0.95
    raw = [p.detach().clone() for p in tr.field.parameters()]
    seen = []
    from hvd_ngp.training import trainer as train_module

    def spy(field, *a, **k):
        seen.append([p.detach().clone() for p in field.parameters()])
        return {"psnr": 0.0, "ssim": 0.0, "views": 0}

    orig = train_module.evaluate
    train_module.evaluate = spy
    try:
        tr.evaluate(n_views=1)
    finally:
        train_module.evaluate = orig
    assert all(torch.equal(a, b) for a, b in zip(seen[0], ema.average))
    assert any(not torch.equal(a, b) for a, b in zip(seen[0], raw))
    assert all(torch.equal(a, b) for a, b in zip(tr.field.parameters(), raw))  # swapped back


def test_ngp_protocol_runs_and_one_sample_at_midpoints_renders_like_std_on_black(trained):
    from hvd_ngp.training.evaluate import ViewRenderer, evaluate, reference_view

    tr, test = trained, trained.scene.test
    black = torch.zeros(3)
    renderer = ViewRenderer(tr.field, tr.grid, tr.march.schedule, tr.march.early_termination)
    std = renderer.view(test, 0, black)
    ngp1 = renderer.view_ngp(test, 0, spp=1)
    torch.testing.assert_close(ngp1, std, atol=2e-5, rtol=0)
    ref, ref_std = reference_view(test, 0, "ngp", black), reference_view(test, 0, "std", black)
    w, h = test.image_size(0)
    opaque = test.images[0, :h, :w, 3].reshape(-1) == 255  # where both protocols' references agree
    assert opaque.any()
    torch.testing.assert_close(ref[opaque], ref_std[opaque], atol=2e-5, rtol=0)
    ev = evaluate(tr.field, tr.grid, test, tr.march.schedule, tr.march.early_termination, "white", 1, protocol="ngp")
    assert ev["views"] == 1 and 0 < ev["psnr"] < 100


def test_occupancy_update_cadence_fixed_and_instant_ngp_ramp():
    from hvd_ngp.training.recipe import Marching

    block = {
        "steps_per_diagonal": 1024,
        "grid_resolution": 128,
        "early_termination": 1e-4,
        "update_interval": 16,
        "warmup_steps": 256,
    }
    fixed = Marching.from_config(block, 1)
    ramp = Marching.from_config({**block, "update_schedule": "ramp"}, 1)
    assert [s for s in range(64) if fixed.update_due(s)] == [0, 16, 32, 48]
    due = [s for s in range(300) if ramp.update_due(s)]
    assert due[:32] == list(range(32)) and 33 not in due and {32, 34, 36, 48, 51, 256, 272} <= set(due)
    assert [s for s in due if s >= 256] == [256, 272, 288]  # every 16 from step 256, as fixed
    with pytest.raises(ConfigError, match="update_schedule must be"):
        Marching.from_config({**block, "update_schedule": "often"}, 1, "my.json")


def test_march_kernel_launch_from_the_marching_block():
    from hvd_ngp.render import MarchLaunch
    from hvd_ngp.training.recipe import Marching

    block = {
        "steps_per_diagonal": 1024,
        "grid_resolution": 128,
        "early_termination": 1e-4,
        "update_interval": 16,
        "warmup_steps": 256,
    }
    assert Marching.from_config(block, 1).launch is None  # the kernel's default
    launch = Marching.from_config({**block, "kernel_launch": {"block": 32, "warps": 1}}, 1).launch
    assert launch == MarchLaunch(block=32, segment=MarchLaunch().segment, warps=1)
    for bad, match in (
        ({"block": 48}, "block must be a power of two"),
        ({"rays": 32}, "keys among"),
        ([32, 64, 1], "must be an object"),
        ({"warps": True}, "warps must be"),
    ):
        with pytest.raises(ConfigError, match=f"my.json: marching.kernel_launch.*{match}"):
            Marching.from_config({**block, "kernel_launch": bad}, 1, "my.json")


def test_evaluations_march_with_their_own_step_where_the_block_asks():
    """``eval_steps_per_diagonal``: evaluations and renders take twice the samples per ray at 2048 (one H200,
    lego at 300 s: +0.16 dB on both seeds, docs/BENCHMARKS.md); training and the grid keep 1024's step."""
    import math

    from hvd_ngp.config import BASE_CONFIG, load_json_config
    from hvd_ngp.training.recipe import Marching

    block = {
        "steps_per_diagonal": 1024,
        "grid_resolution": 128,
        "early_termination": 1e-4,
        "update_interval": 16,
        "warmup_steps": 256,
    }
    plain = Marching.from_config(block, 1)
    assert plain.eval_schedule is None and plain.render_schedule is plain.schedule
    fine = Marching.from_config({**block, "eval_steps_per_diagonal": 2048}, 4)
    assert fine.schedule == Marching.from_config(block, 4).schedule
    assert fine.render_schedule.dt_min == pytest.approx(math.sqrt(3) / 2048)
    assert fine.render_schedule.dt_max == pytest.approx(fine.schedule.dt_max)  # a coarsest-cascade cell either way
    assert fine.render_schedule.cone_angle == fine.schedule.cone_angle == pytest.approx(1 / 256)
    assert Marching.from_config({**block, "eval_steps_per_diagonal": 1024}, 1).eval_schedule is None
    assert load_json_config(BASE_CONFIG)["marching"]["eval_steps_per_diagonal"] == 2048
    for bad in (0, -5, 1.5, True, "2048"):
        with pytest.raises(ConfigError, match="my.json: marching.eval_steps_per_diagonal must be"):
            Marching.from_config({**block, "eval_steps_per_diagonal": bad}, 1, "my.json")


def test_marching_numbers_out_of_range_are_config_errors_naming_the_file():
    """A zero update interval would divide by zero at step 0, a negative stop transmittance makes the Triton
    compositor drop every sample, a candidate factor below 1 gives buffers that hold fewer marched samples than
    network samples: each is a ``ConfigError`` naming the config."""
    from hvd_ngp.training.recipe import Marching

    block = {
        "steps_per_diagonal": 1024,
        "grid_resolution": 128,
        "early_termination": 1e-4,
        "update_interval": 16,
        "warmup_steps": 256,
    }
    assert Marching.from_config(block, 1).candidate_factor == 4.0
    assert Marching.from_config({**block, "candidate_factor": 2.5, "early_termination": 0}, 1).candidate_factor == 2.5
    for patch, match in (
        ({"update_interval": 0}, "update_interval must be >= 1"),
        ({"warmup_steps": -1}, "warmup_steps must be >= 0"),
        ({"early_termination": -1e-4}, "early_termination must be in"),
        ({"early_termination": 1.0}, "early_termination must be in"),
        ({"candidate_factor": 0}, "candidate_factor must be >= 1"),
        ({"candidate_factor": 0.5}, "candidate_factor must be >= 1"),
    ):
        with pytest.raises(ConfigError, match=f"my.json: marching.{match}"):
            Marching.from_config({**block, **patch}, 1, "my.json")


def test_precision_auto_is_bf16_only_for_the_triton_step_on_a_gpu():
    from hvd_ngp.training.recipe import resolve_precision

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert resolve_precision("auto", cuda, "triton") == "bf16"
    assert resolve_precision("auto", cuda, "triton", model_parallel=True) == "fp32"
    for device, backend in ((cuda, "tcnn"), (cuda, "torch"), (cpu, "triton"), (cpu, "torch"), (cpu, "cpp")):
        assert resolve_precision("auto", device, backend) == "fp32"
    for chosen in ("fp32", "fp16", "bf16"):  # an explicit choice stays
        assert resolve_precision(chosen, cuda, "triton") == chosen == resolve_precision(chosen, cpu, "torch")


def test_cpu_trainer_resolves_precision_auto_to_fp32(scene_cache, tmp_path):
    tr = tiny_trainer(scene_cache, tmp_path, 1)
    assert tr.precision == "fp32" and not getattr(tr.field.density_mlp, "train_fused", False)


def test_fused_adam_on_request_follows_the_foreach_one():
    """``"fused": true`` in the Adam block builds torch's fused Adam (``"auto"``, the default: only for
    the graphed step on a GPU); its steps follow the foreach Adam's to rounding; another value is an error
    naming the config."""
    from hvd_ngp.model.field import NGPField
    from hvd_ngp.training.recipe import make_optimizer

    args = parse_args(["--config", str(CPU_CONFIG)])
    block = args.model["optimizer"]
    chain = OptimizerChain.parse(block, "cpu.json")
    fused_block = json.loads(json.dumps(block))
    OptimizerChain.parse(fused_block, "cpu.json").adam["fused"] = True
    fields, opts = [], []
    for b in (block, fused_block):
        torch.manual_seed(0)
        field = NGPField(args.model, torch.tensor([[0.0] * 3, [1.0] * 3]))
        opt, _ = make_optimizer(field, b, "cpu.json")
        fields.append(field)
        opts.append(opt)
    assert not opts[0].defaults.get("fused") and opts[1].defaults["fused"] and chain.adam.get("fused") is None
    for _ in range(3):
        grads = [torch.randn_like(p) for p in fields[0].parameters()]
        for field, opt in zip(fields, opts):
            for p, g in zip(field.parameters(), grads):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(fields[0].parameters(), fields[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    OptimizerChain.parse(fused_block, "cpu.json").adam["fused"] = "yes"
    with pytest.raises(ConfigError, match='cpu.json: optimizer Adam.fused must be true, false or "auto"'):
        make_optimizer(fields[0], fused_block, "cpu.json")


def test_l2_on_the_hash_table_is_opt_in_and_pulls_untouched_entries_towards_zero():
    """``l2_reg_encoding`` (nerfacc's instant-ngp decays every parameter; instant-ngp only the MLPs):
    default 0; with it, a table entry whose gradient is zero still shrinks; refused beside sparse updates."""
    from hvd_ngp.model.field import NGPField
    from hvd_ngp.training.recipe import make_optimizer

    args = parse_args(["--config", str(CPU_CONFIG)])
    field = NGPField(args.model, torch.tensor([[0.0] * 3, [1.0] * 3]))
    block = json.loads(json.dumps(args.model["optimizer"]))
    adam = OptimizerChain.parse(block, "cpu.json").adam
    opt, _ = make_optimizer(field, block, "cpu.json")
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, adam.get("l2_reg", 1e-6)]
    adam["l2_reg_encoding"] = 0.1
    opt, _ = make_optimizer(field, block, "cpu.json")
    table = opt.param_groups[0]["params"][0]
    with torch.no_grad():
        table.copy_(torch.linspace(-1, 1, table.numel()).view_as(table))  # the start is within 1e-4 of 0
    before = table.detach().clone()
    for p in field.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    away = before.abs() > 1e-3
    assert opt.param_groups[0]["weight_decay"] == 0.1 and away.float().mean() > 0.99
    assert torch.all((table.detach() - before)[away] * before[away] < 0)  # every entry moved towards 0
    for bad, message in ((-1.0, "must be a number in"), ("1e-6", "must be a number in")):
        adam["l2_reg_encoding"] = bad
        with pytest.raises(ConfigError, match=f"cpu.json: optimizer Adam.l2_reg_encoding {message}"):
            make_optimizer(field, block, "cpu.json")
    adam.update({"l2_reg_encoding": 1e-6, "sparse_hash_updates": True})
    with pytest.raises(ConfigError, match="needs dense hash-table updates"):
        make_optimizer(field, block, "cpu.json")


def test_density_bias_shifts_the_density_logit():
    """``network.density_bias`` b: sigma = exp(first density-MLP output + b) (nerfacc's -1), the colours and
    the geometry features unchanged; anything but a finite number is an error naming the config."""
    from hvd_ngp.model.field import NGPField

    args = parse_args(["--scene", "builtin", "--config", str(CPU_CONFIG)], default_config=CPU_CONFIG)
    aabb = torch.tensor([[0.0] * 3, [1.0] * 3])
    x, d = torch.rand(64, 3), torch.nn.functional.normalize(torch.randn(64, 3), dim=-1)
    outs = []
    for bias in (None, -1.0):
        model = json.loads(json.dumps(args.model))
        if bias is not None:
            model["network"]["density_bias"] = bias
        torch.manual_seed(0)
        field = NGPField(model, aabb)
        outs.append((field.query_density(x), field(x, d)))
    (sigma0, geo0), (rgb0, _) = outs[0]
    (sigma1, geo1), (rgb1, _) = outs[1]
    torch.testing.assert_close(sigma1, sigma0 * torch.exp(torch.tensor(-1.0)))
    assert torch.equal(geo0, geo1) and torch.equal(rgb0, rgb1)
    for bad in ("-1", float("nan"), True):
        model = json.loads(json.dumps(args.model))
        model["network"]["density_bias"] = bad
        model["_source"] = "cpu.json"
        with pytest.raises(ConfigError, match="cpu.json: network.density_bias must be a finite number"):
            NGPField(model, aabb)
