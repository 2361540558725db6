"""Triton kernels of the fast GPU path. Each has a plain-PyTorch twin elsewhere in the package and a
parity test (``tests/test_kernels.py``).

Triton is imported lazily: ``import hvd_ngp`` works without it. On a CPU the kernels run only under
Triton's interpreter (``TRITON_INTERPRET=1``, used by the tests; ``tests/compile_kernels.py`` then
compiles each recorded launch for sm_90 without a GPU); in training they run on CUDA.
"""

from __future__ import annotations

import os

from .errors import BackendError


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
