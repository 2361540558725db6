"""Compile recorded Triton kernel launches ahead of time for an NVIDIA GPU, without one.

    python tests/compile_kernels.py LAUNCHES.json [--arch 90]

``LAUNCHES.json`` lists launches as ``tests/test_kernels.py`` records them under Triton's interpreter:
``[{"module": ..., "kernel": ..., "signature": {arg: type}, "constexprs": {arg: value}}, ...]``. Each is
compiled with Triton's CUDA backend (its bundled ptxas) to a cubin for ``sm_<arch>``, which catches what
the CPU interpreter cannot: code the GPU compiler rejects. Run it without ``TRITON_INTERPRET`` (the
kernels must import as compilable ``JITFunction``s). Prints one line per launch; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("launches", type=Path)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper, H100/H200)")
    args = parser.parse_args()

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", args.arch, 32)
    failures = 0
    for launch in json.loads(args.launches.read_text()):
        fn = getattr(importlib.import_module(launch["module"]), launch["kernel"])
        name = f"{launch['kernel']}({', '.join(f'{k}={v}' for k, v in launch['constexprs'].items())})"
        try:
            compiled = triton.compile(ASTSource(fn, launch["signature"], launch["constexprs"]), target=target)
        except Exception as e:  # report every failing launch, then fail
            failures += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e).strip()[:2000]}", flush=True)
            continue
        print(f"ok   {name}: sm_{args.arch} cubin {len(compiled.asm['cubin'])} bytes", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
