"""Hash-grid encoding as a C++ CPU kernel (compiled on first use with torch's extension tools).

Twin of ``HashGridTorch`` (same parameters, same indexing); ``tests/test_encoding.py`` checks
forward values and table gradients against it. Built once per Python environment and source version into
``<sys.prefix>/share/hvd_ngp/torch_extensions/hashgrid_cpu-<hash>`` from a copy of the source kept
there, so checkouts and virtual environments never rebuild each other's copy
(``scripts/setup.sh`` builds it ahead of time). Concurrent ranks wait on torch's build lock.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...errors import BackendError
from .hashgrid import HashGridSpec, HashGridTorch

SOURCE = Path(__file__).with_name("csrc") / "hashgrid_cpu.cpp"
_ext: Any = None  # the compiled extension module (torch.utils.cpp_extension.load)


def load_extension(verbose: bool = False):
    """Compile (first time) and import the extension; raises ``BackendError`` if that is impossible."""
    global _ext
    if _ext is None:
        try:
            from torch.utils.cpp_extension import load

            build_dir, source = _build_location()
            _ext = load(
                name="hvd_ngp_hashgrid_cpu",
                sources=[source],
                extra_cflags=["-O3"],
                verbose=verbose,
                build_directory=build_dir,
            )
        except Exception as exc:  # compiler or ninja missing, headers mismatched...
            raise BackendError(
                f"the C++ hash-grid kernel could not be built ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}); it needs g++ and "
                "ninja (pip install ninja), or use --backend torch"
            ) from None
    return _ext


def _build_location() -> tuple[str | None, str]:
    """(build folder, source path): a content-addressed copy inside this Python environment, or
    torch's default folder and the packaged source if the environment is read-only."""
    code = SOURCE.read_bytes()
    folder = (
        Path(sys.prefix)
        / "share"
        / "hvd_ngp"
        / "torch_extensions"
        / f"hashgrid_cpu-{hashlib.sha1(code).hexdigest()[:10]}"
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        copy = folder / SOURCE.name
        if not copy.is_file() or copy.read_bytes() != code:
            tmp = folder / f".{SOURCE.name}.{os.getpid()}"
            tmp.write_bytes(code)
            os.replace(tmp, copy)
        return str(folder), str(copy)
    except OSError:
        return None, str(SOURCE)


def available() -> bool:
    try:
        load_extension()
        return True
    except BackendError:
        return False


class _HashGridCppFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, params: Tensor, enc: "HashGridCpp") -> Tensor:
        ctx.save_for_backward(x)
        ctx.enc = enc
        return _ext.forward(x, params, enc.scales, enc.resolutions, enc.sizes, enc.offsets, enc.hashed_mask)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        enc = ctx.enc
        p = enc.params
        g = _ext.backward(
            grad, x, p.shape[0], p.shape[1], enc.scales, enc.resolutions, enc.sizes, enc.offsets, enc.hashed_mask
        )
        return None, g, None


class HashGridCpp(HashGridTorch):
    """``HashGridTorch`` with forward/backward in C++ (CPU tensors, float32)."""

    def __init__(self, spec: HashGridSpec) -> None:
        super().__init__(spec)
        load_extension()

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu":
            raise BackendError("the 'cpp' hash-grid backend runs on the CPU only; use --backend torch on GPU")
        return _HashGridCppFunction.apply(x.float().contiguous(), self.params, self)
