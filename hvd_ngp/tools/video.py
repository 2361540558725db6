"""Videos that browsers play: H.264 (libx264) in an mp4, yuv420p, even frame sizes, through PyAV (which brings its
own FFmpeg libraries)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from ..errors import HvdNgpError


def even_crop(img: np.ndarray) -> np.ndarray:
    """``[H, W, 3]`` -> the largest top-left crop of even height and width (yuv420p halves both)."""
    h, w = img.shape[:2]
    return img[: h - h % 2, : w - w % 2]


def write_mp4(frames: list[Path], path: Path, fps: float, crf: int = 18) -> None:
    """PNG ``frames`` (in order, one size) -> ``path``: H.264, yuv420p, the index at the front (faststart), so a
    browser's <video> plays it; odd sizes lose their last row or column."""
    import cv2

    try:
        import av
    except ImportError:
        raise HvdNgpError(
            f"{path}: writing H.264 video needs PyAV: pip install av "
            f"(the PNG frames are in {frames[0].parent if frames else path.parent})"
        ) from None
    image = cv2.imread(str(frames[0]))
    if image is None:
        raise HvdNgpError(f"{frames[0]}: cannot read this frame")
    first = even_crop(image)
    h, w = first.shape[:2]
    if h < 2 or w < 2:
        raise HvdNgpError(f"{path}: frames of {w}x{h} pixels are too small for H.264")
    with av.open(str(path), "w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"crf": str(crf)}
        for p in frames:
            bgr = cv2.imread(str(p))
            if bgr is None or even_crop(bgr).shape != first.shape:
                raise HvdNgpError(f"{p}: missing, unreadable or not {w}x{h}: cannot add it to {path}")
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(even_crop(bgr)), format="bgr24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
