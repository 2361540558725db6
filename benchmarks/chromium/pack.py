"""Split a bundle archive into parts that each fit one device call, and write the script that joins them.

    python benchmarks/chromium/pack.py ARCHIVE OUT_DIR [--limits 20000000,38000000,45000000]

Writes OUT_DIR/part-1 .. part-N (at most the limits' bytes each, in order; fewer parts when the archive is
small) and OUT_DIR/assemble.sh from assemble.sh.in beside this file, with the parts' and the archive's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

LIMITS = (20_000_000, 38_000_000, 45_000_000)  # bytes: each part travels beside a scene in one 64 MB call


def pack(archive: Path, out: Path, limits: tuple[int, ...] = LIMITS) -> list[Path]:
    """The parts written (``out/part-1`` ...) and ``out/assemble.sh``; ValueError when the archive is too big."""
    data = archive.read_bytes()
    if len(data) > sum(limits):
        raise ValueError(f"{archive}: {len(data)} bytes, more than the parts hold ({sum(limits)})")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*"):
        old.unlink()
    parts, sums, pos = [], [], 0
    for i, limit in enumerate(limits, 1):
        if pos >= len(data):
            break
        chunk = data[pos : pos + limit]
        pos += len(chunk)
        parts.append(out / f"part-{i}")
        parts[-1].write_bytes(chunk)
        sums.append(hashlib.sha256(chunk).hexdigest())
    template = (Path(__file__).parent / "assemble.sh.in").read_text()
    script = template.replace("@N@", str(len(parts))).replace("@SUMS@", " ".join(sums))
    (out / "assemble.sh").write_text(script.replace("@TOTAL@", hashlib.sha256(data).hexdigest()))
    (out / "assemble.sh").chmod(0o755)
    return parts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("archive", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--limits", default=",".join(map(str, LIMITS)), help="bytes per part, comma-separated")
    a = p.parse_args(argv)
    try:
        parts = pack(a.archive, a.out_dir, tuple(int(x) for x in a.limits.split(",")))
    except ValueError as e:
        print(f"pack.py: {e}", file=sys.stderr)
        return 2
    for part in parts:
        print(f"{part}: {part.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
