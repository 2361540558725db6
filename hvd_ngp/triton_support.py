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

#: the fused kernels' math outside autocast, in this thread's context (``inference_math``)
_INFERENCE_MATH: ContextVar[str | None] = ContextVar("hvd_ngp_inference_math", default=None)
#: "ieee": fp32 throughout; "tf32": tf32 tensor-core products; "fp16": half products and a half copy of the table
INFERENCE_MATHS = ("ieee", "tf32", "fp16")


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
def inference_math(math: str) -> Iterator[None]:
    """Inside: the fused Triton kernels outside autocast compute in ``math``, one of ``INFERENCE_MATHS``,
    instead of following ``torch.backends.cuda.matmul.allow_tf32``:

    - "ieee": fp32 throughout (on the CPU "tf32" computes this too);
    - "tf32": fp32 with tf32 tensor-core products, on CUDA;
    - "fp16": the MLPs in half products with fp32 sums (half outputs, as under autocast), and the hash grid's
      passes without gradients gathering from a half copy of its table (``HashGridTriton.inference_table``),
      on any device.

    Scoped to this thread's context (a ContextVar): a viewer rendering beside training changes nothing there."""
    if math not in INFERENCE_MATHS:
        raise ValueError(f"inference math must be one of {INFERENCE_MATHS}, got {math!r}")
    token = _INFERENCE_MATH.set(math)
    try:
        yield
    finally:
        _INFERENCE_MATH.reset(token)


def inference_math_now() -> str | None:
    """The math ``inference_math`` set in this context, or None outside it."""
    return _INFERENCE_MATH.get()
