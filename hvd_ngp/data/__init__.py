"""Scenes: file formats, the built-in scene, and the rank-aware ray sampler."""

from __future__ import annotations

import os

from .builtin import ensure_builtin
from .scene import Frames, Scene
from .transforms import load_transforms_scene

BUILTIN = "builtin"


def load_scene(scene: str | os.PathLike = BUILTIN, *, scene_cache: str | os.PathLike = "~/.cache/hvd_ngp/scenes",
               builtin_seed: int = 0, train_split: str = "train", test_split: str = "test", holdout_every: int = 0,
               downscale: int = 1) -> Scene:
    """Load ``scene`` ('builtin' or a path); raises ``SceneError`` naming the file on bad input."""
    path = ensure_builtin(scene_cache, builtin_seed) if str(scene) == BUILTIN else scene
    return load_transforms_scene(path, train_split, test_split, holdout_every, downscale)


__all__ = ["BUILTIN", "Frames", "Scene", "load_scene"]
