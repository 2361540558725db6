"""Image files shared by the scene formats: decoding to ``[H, W, 4]`` uint8 RGBA, sizes from headers,
parallel decoding and padded stacks ``[N, H_max, W_max, 4]``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import torch

from ..errors import SceneError, os_cause

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG", ".webp", ".exr", ".bmp", ".tif", ".tiff")


def read_image(path: Path, downscale: int = 1) -> np.ndarray:
    """Decode an image to ``[H, W, 4]`` uint8 RGBA (OpenCV; 16-bit and float images are converted)."""
    try:  # read here, not by OpenCV, which says "cannot decode" for a missing or unreadable file too
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SceneError(f"{path}: cannot read image: {os_cause(exc)}") from None
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED) if data else None
    if img is None:
        raise SceneError(
            f"{path}: cannot decode image (corrupt or unsupported format{', empty file' if not data else ''})"
        )
    if img.dtype == np.uint16:
        img = (img.astype(np.float32) / 257.0 + 0.5).astype(np.uint8)
    elif img.dtype in (np.float32, np.float64):  # linear EXR/HDR -> sRGB 8-bit
        lin = np.clip(img, 0.0, 1.0)
        srgb = np.where(lin <= 0.0031308, 12.92 * lin, 1.055 * np.power(lin, 1 / 2.4) - 0.055)
        img = (srgb * 255.0 + 0.5).astype(np.uint8)
    if img.ndim == 2:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2RGBA)
    elif img.shape[2] == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGBA)
    else:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGBA)
    if downscale > 1:
        h, w = img.shape[:2]
        img = cv2.resize(img, (w // downscale, h // downscale), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(img)


def read_mask(mask_path: Path, width: int, height: int) -> np.ndarray:
    """A grey mask image -> ``[height, width]`` bool, True where the pixel counts (non-zero), resized (nearest)."""
    mask = cv2.imread(str(mask_path), cv2.IMREAD_GRAYSCALE)
    if mask is None:
        raise SceneError(f"{mask_path}: cannot decode mask image")
    if mask.shape != (height, width):
        mask = cv2.resize(mask, (width, height), interpolation=cv2.INTER_NEAREST)
    return mask != 0


def apply_mask(image: np.ndarray, mask_path: Path) -> np.ndarray:
    """Zero the alpha of ``image`` ``[H, W, 4]`` where the grey mask image is zero (resized to the image)."""
    image[..., 3][~read_mask(mask_path, image.shape[1], image.shape[0])] = 0
    return image


def read_masked(path: Path, downscale: int, mask_path: Path | None) -> np.ndarray:
    """``read_image`` with alpha zeroed where the frame's mask (if any) is zero."""
    image = read_image(path, downscale)
    return image if mask_path is None else apply_mask(image, mask_path)


def image_size(path: Path, downscale: int = 1) -> tuple[int, int]:
    """(width, height) of ``path`` as ``read_image`` will return it: from the file header when Pillow can
    read it (no decoding), else by decoding the image once."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            w, h = im.size
    except Exception:  # no Pillow, or a format it does not know (EXR): decode
        h, w = read_image(path).shape[:2]
    return (w // downscale, h // downscale) if downscale > 1 else (w, h)


def decode_images(
    paths: list[Path], downscale: int, threads: int = 8, masks: list[Path | None] | None = None
) -> list[np.ndarray]:
    """Decode in parallel threads (OpenCV releases the GIL while decoding); ``masks``: per image or None."""
    if not paths:
        return []
    masks = masks or [None] * len(paths)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(paths)))) as pool:
        return list(pool.map(lambda pm: read_masked(pm[0], downscale, pm[1]), zip(paths, masks)))


def stack_masks(masks: list[Path | None], sizes: list[tuple[int, int]], threads: int = 8) -> torch.Tensor:
    """Per-frame mask files (None: every pixel counts) at the images' sizes (width, height) -> ``[N, H_max, W_max]``
    bool, True where a pixel counts; the padding is False."""
    wmax, hmax = max(w for w, _ in sizes), max(h for _, h in sizes)
    keep = torch.zeros((len(sizes), hmax, wmax), dtype=torch.bool)

    def one(i: int) -> None:
        w, h = sizes[i]
        mask = masks[i]
        keep[i, :h, :w] = True if mask is None else torch.from_numpy(read_mask(mask, w, h))

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(sizes)))) as pool:
        list(pool.map(one, range(len(sizes))))
    return keep


def stack_images(images: list[np.ndarray]) -> tuple[torch.Tensor, bool]:
    """Decoded images -> ``[N, H_max, W_max, 4]`` uint8 (zero padded) and whether any alpha is below 255."""
    wmax, hmax = max(im.shape[1] for im in images), max(im.shape[0] for im in images)
    stack = np.zeros((len(images), hmax, wmax, 4), np.uint8)
    for i, im in enumerate(images):
        stack[i, : im.shape[0], : im.shape[1]] = im
    return torch.from_numpy(stack), any(im[..., 3].min() < 255 for im in images)
