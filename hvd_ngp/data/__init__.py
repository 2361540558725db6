"""Scenes: file formats, the built-in scene, and the rank-aware ray sampler."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from .builtin import ensure_builtin
from .llff import load_llff_scene
from .packed import is_packed, load_packed_scene
from .scene import Frames, Scene
from .transforms import load_transforms_scene

BUILTIN = "builtin"


def scene_format(path: str | os.PathLike) -> str:
    """'packed' for a folder with packed.json (``hvd-ngp-data pack``), 'llff' for one with poses_bounds.npy,
    else 'transforms' (instant-ngp / Blender / nerfstudio)."""
    p = Path(path).expanduser()
    if is_packed(p):
        return "packed"
    return "llff" if p.is_dir() and (p / "poses_bounds.npy").is_file() else "transforms"


def load_scene(
    scene: str | os.PathLike = BUILTIN,
    *,
    scene_cache: str | os.PathLike = "~/.cache/hvd_ngp/scenes",
    builtin_seed: int = 0,
    train_split: str = "train",
    test_split: str = "test",
    holdout_every: int = 0,
    downscale: int = 1,
    sharpness_threshold: float = 0.0,
    lazy_train: bool = False,
    mask_mode: str = "alpha",
) -> Scene:
    """Load ``scene`` ('builtin' or a path); raises ``SceneError`` naming the file on bad input.

    ``lazy_train``: read the training images' sizes but not their pixels (``scene.train.images`` is
    None, ``scene.train.files`` decodes them): the trainer's data pipeline places them itself.
    ``mask_mode``: what nerfstudio's per-frame ``mask_path`` does ("alpha" or "exclude"; ``transforms``).
    """
    path = ensure_builtin(scene_cache, builtin_seed) if str(scene) == BUILTIN else scene
    if scene_format(path) == "packed":
        if mask_mode == "exclude":
            raise ConfigError(
                f"{path}: --mask_mode exclude needs the scene's transforms.json: a packed scene "
                "holds its masks as alpha (hvd-ngp-data pack applied them)"
            )
        return load_packed_scene(path, holdout_every, downscale, lazy_train)
    if scene_format(path) == "llff":
        return load_llff_scene(path, holdout_every, downscale, lazy_train)
    return load_transforms_scene(
        path, train_split, test_split, holdout_every, downscale, sharpness_threshold, lazy_train, mask_mode
    )


__all__ = ["BUILTIN", "Frames", "Scene", "load_scene", "scene_format"]
