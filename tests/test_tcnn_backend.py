"""The optional tiny-cuda-nn backend: selection, the clear error without it, and the field built from
instant-ngp blocks through tinycudann's module API (with ``tests/fake_tcnn``'s stand-in on machines
without tinycudann; it will be checked against a real build on a GPU node)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hvd_ngp.config import BASE_CONFIG, parse_args
from hvd_ngp.errors import BackendError, ConfigError
from hvd_ngp.model import encoding
from hvd_ngp.model.encoding import tcnn as tcnn_backend
from hvd_ngp.model.field import NGPField

AABB = torch.tensor([[-1.0] * 3, [1.0] * 3])


@pytest.fixture
def fake_tcnn(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).with_name("fake_tcnn")))
    monkeypatch.delitem(sys.modules, "tinycudann", raising=False)
    import tinycudann

    tinycudann.CREATED.clear()
    yield tinycudann
    sys.modules.pop("tinycudann", None)


@pytest.fixture
def no_tcnn(monkeypatch):
    monkeypatch.setitem(sys.modules, "tinycudann", None)  # import raises ImportError


def base_model(*argv: str) -> dict:
    return parse_args(["--config", str(BASE_CONFIG), *argv]).model


def test_without_tinycudann_choosing_it_says_how_to_install_and_auto_falls_back(no_tcnn, monkeypatch):
    with pytest.raises(BackendError, match="pip install git\\+https://github.com/NVlabs/tiny-cuda-nn/"):
        tcnn_backend.import_tcnn()
    assert not tcnn_backend.tcnn_available()
    monkeypatch.setattr("hvd_ngp.triton_support.triton_available", lambda device_type="cuda": True)
    monkeypatch.setattr("hvd_ngp.triton_support.require_triton", lambda device_type="cuda": None)
    cuda = torch.device("cuda")
    with pytest.raises(BackendError, match="tiny-cuda-nn's PyTorch bindings"):
        encoding.resolve_backend("tcnn", cuda)
    assert encoding.resolve_backend("auto", cuda) == "triton"
    with pytest.raises(ConfigError, match="CUDA GPUs only"):
        encoding.resolve_backend("tcnn", torch.device("cpu"))


def test_auto_prefers_triton_on_a_gpu_even_with_tinycudann_installed(fake_tcnn, monkeypatch):
    monkeypatch.setattr("hvd_ngp.triton_support.triton_available", lambda device_type="cuda": True)
    cuda = torch.device("cuda")
    assert encoding.resolve_backend("auto", cuda) == "triton"  # tcnn: 0.8 dB lower at 60 s (issue 14)
    monkeypatch.setattr("hvd_ngp.triton_support.triton_available", lambda device_type="cuda": False)
    assert encoding.resolve_backend("auto", cuda) == "torch"  # marching needs Triton in either fast backend


def test_field_feeds_tinycudann_the_instant_ngp_blocks_and_trains(fake_tcnn):
    model = base_model()
    field = NGPField(model, AABB, "tcnn")
    kinds = [(c["kind"], c["config"]["otype"]) for c in fake_tcnn.CREATED]
    assert kinds == [("Encoding", "HashGrid"), ("Network", "FullyFusedMLP"), ("Network", "FullyFusedMLP")]
    grid, density, rgb = fake_tcnn.CREATED
    enc = model["encoding"]
    assert (
        grid["config"]["n_levels"] == enc["n_levels"]
        and grid["config"]["log2_hashmap_size"] == enc["log2_hashmap_size"]
    )
    assert density["n_input_dims"] == field.encoding.n_output_dims and density["n_output_dims"] == 16
    assert density["config"]["n_neurons"] == model["network"]["n_neurons"]
    assert rgb["n_input_dims"] == field.dir_encoding.n_output_dims + 16 and rgb["n_output_dims"] == 3
    assert all(c["config"]["output_activation"] == "None" for c in (density, rgb))  # the field applies its own
    # parameter groups: the hash grid alone, the MLPs alone (L2 on MLP weights only)
    enc_ids = {id(p) for p in field.encoding_parameters()}
    mlp_ids = {id(p) for p in field.mlp_parameters()}
    assert not enc_ids & mlp_ids and enc_ids | mlp_ids == {id(p) for p in field.parameters()}
    x = torch.rand(256, 3) * 2 - 1
    d = torch.nn.functional.normalize(torch.randn(256, 3), dim=-1)
    rgb_out, sigma = field(x, d)  # the fake asserts its hash grid gets inputs in [0, 1]
    assert rgb_out.dtype == torch.float32 and sigma.dtype == torch.float32
    assert bool(((rgb_out >= 0) & (rgb_out <= 1)).all()) and bool((sigma > 0).all())
    (rgb_out.sum() + sigma.sum()).backward()
    for p in (field.encoding.tcnn.params, field.density_mlp.tcnn.params, field.rgb_mlp.tcnn.params):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    assert tcnn_backend.uses_tcnn_layout(field.state_dict())
    assert not tcnn_backend.uses_tcnn_layout(NGPField(model, AABB, "torch").state_dict())


def test_bad_widths_for_the_fused_mlp_name_the_config(fake_tcnn):
    model = base_model("--density_network", '{"n_neurons": 48}')
    with pytest.raises(ConfigError, match=r"network.n_neurons 48 is not a FullyFusedMLP width .*CutlassMLP"):
        NGPField(model, AABB, "tcnn")
    model = base_model("--density_network", '{"n_neurons": 48, "otype": "CutlassMLP"}')
    fake_tcnn.CREATED.clear()
    NGPField(model, AABB, "tcnn")
    assert fake_tcnn.CREATED[1]["config"]["otype"] == "CutlassMLP"
