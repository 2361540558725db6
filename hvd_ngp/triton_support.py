"""Triton kernels of the fast GPU path. Each has a plain-PyTorch twin elsewhere in the package and a
parity test (``tests/test_kernels.py``).

Triton is imported lazily: ``import hvd_ngp`` works without it. On a CPU the kernels run only under
Triton's interpreter (``TRITON_INTERPRET=1``, used by the tests; ``tests/compile_kernels.py`` then
compiles each recorded launch for sm_90 without a GPU); in training they run on CUDA.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

from .errors import BackendError

#: fp32 matmul math of the fused kernels outside autocast, in this thread's context (``fp32_matmul``)
_FP32_MATMUL: ContextVar[str | None] = ContextVar("hvd_ngp_fp32_matmul", default=None)
FP32_MATMULS = ("ieee", "tf32")


def triton_available(device_type: str = "cuda") -> bool:
    """True when Triton imports and can run on ``device_type`` (CPU needs TRITON_INTERPRET=1)."""
    if device_type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:
        return False
    if device_type == "cuda":
        import torch

        return torch.cuda.is_available()
    return True


def require_triton(device_type: str = "cuda") -> None:
    if not triton_available(device_type):
        raise BackendError(
            "the Triton kernels need the 'triton' package and a CUDA GPU (pip install triton); use --backend torch"
        )


@contextmanager
def fp32_matmul(math: str) -> Iterator[None]:
    """Inside: the fused Triton MLP kernels outside autocast use ``math`` ("tf32": tensor-core products with
    tf32 inputs; "ieee": fp32 throughout) on CUDA instead of following ``torch.backends.cuda.matmul.allow_tf32``.
    Scoped to this thread's context (a ContextVar): a viewer rendering beside training changes nothing there."""
    if math not in FP32_MATMULS:
        raise ValueError(f"fp32 matmul math must be one of {FP32_MATMULS}, got {math!r}")
    token = _FP32_MATMUL.set(math)
    try:
        yield
    finally:
        _FP32_MATMUL.reset(token)


def fp32_matmul_math() -> str | None:
    """The math ``fp32_matmul`` set in this context, or None outside it."""
    return _FP32_MATMUL.get()
