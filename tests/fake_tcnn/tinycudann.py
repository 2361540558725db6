"""A stand-in for tiny-cuda-nn's PyTorch bindings (``import tinycudann``) on machines without it.

It implements the documented module API the ``tcnn`` backend uses, ``Encoding(n_input_dims,
encoding_config, seed, dtype)`` and ``Network(n_input_dims, n_output_dims, network_config, seed)``:
one flat fp32 parameter vector ``.params``, ``n_output_dims``, half-precision outputs (tiny-cuda-nn's
preferred precision), inputs checked the way tiny-cuda-nn expects them (encodings: [0, 1]). The
computation reuses the project's reference hash grid, so values are meaningful. Every
created module's arguments are recorded in ``CREATED`` for the tests.
"""

from __future__ import annotations

import torch
from torch import nn

from hvd_ngp.model.encoding.hashgrid import HashGridSpec, HashGridTorch

CREATED: list[dict] = []
HALF = torch.float16


class Encoding(nn.Module):
    def __init__(self, n_input_dims, encoding_config, seed=1337, dtype=None):
        super().__init__()
        CREATED.append({"kind": "Encoding", "n_input_dims": n_input_dims, "config": dict(encoding_config)})
        self.config = dict(encoding_config)
        otype = self.config["otype"]
        if otype == "HashGrid":
            spec = HashGridSpec(**{k: v for k, v in self.config.items() if k != "otype"})
            self.grid = HashGridTorch(spec)
            self.params = nn.Parameter(self.grid.params.detach().reshape(-1).clone())
            self.n_output_dims = spec.n_output_dims
        else:
            raise RuntimeError(f"fake tinycudann: unsupported encoding {otype}")

    def forward(self, x):
        assert x.shape[1] == 3 and float(x.min()) >= 0.0 and float(x.max()) <= 1.0, "encoding inputs must be in [0, 1]"
        table = self.params.view_as(self.grid.params)
        return torch.func.functional_call(self.grid, {"params": table}, (x.float(),)).to(HALF)


class Network(nn.Module):
    def __init__(self, n_input_dims, n_output_dims, network_config, seed=1337):
        super().__init__()
        CREATED.append(
            {
                "kind": "Network",
                "n_input_dims": n_input_dims,
                "n_output_dims": n_output_dims,
                "config": dict(network_config),
            }
        )
        assert network_config["output_activation"] == "None"
        dims = [n_input_dims] + [network_config["n_neurons"]] * network_config["n_hidden_layers"] + [n_output_dims]
        self.shapes = list(zip(dims[1:], dims[:-1]))
        g = torch.Generator().manual_seed(seed)
        self.params = nn.Parameter(
            torch.cat([torch.randn(o * i, generator=g) * (2.0 / i) ** 0.5 for o, i in self.shapes])
        )
        self.n_output_dims = n_output_dims

    def forward(self, x):
        h, at = x.float(), 0
        for k, (o, i) in enumerate(self.shapes):
            h = h @ self.params[at : at + o * i].view(o, i).t()
            at += o * i
            if k < len(self.shapes) - 1:
                h = torch.relu(h)
        return h.to(HALF)
