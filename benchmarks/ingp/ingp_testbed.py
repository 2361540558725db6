"""The instant-ngp anchor's testbed set up for NeRF training as its base config trains, shared by the GPU
scripts that drive it (``ingp_steps.py``, ``ingp_rate.py``, ``ingp_render.py``; run as scripts, so this folder is on sys.path)."""

import os

import numpy as np


def training_testbed(ngp, root: str, train_json: str):
    """A ``pyngp`` (``ngp``) testbed in ``root`` with ``train_json`` loaded, ``configs/nerf/base.json``'s network
    and NeRF train mode, training on."""
    tb = ngp.Testbed()
    tb.root_dir = root
    tb.load_training_data(train_json)
    tb.reload_network_from_file(os.path.join(root, "configs/nerf/base.json"))
    if hasattr(ngp, "TrainMode"):
        tb.nerf.training.train_mode = ngp.TrainMode.Nerf
    tb.shall_train = True
    return tb


def scoring_testbed(ngp, root: str, snapshot: str, test_json: str):
    """A ``pyngp`` testbed with ``snapshot`` loaded and ``test_json``'s views, set to render as hvd_ngp's evaluations
    score: white background, one ray per pixel centre, lens distortion applied, training off."""
    tb = ngp.Testbed()
    tb.root_dir = root
    tb.load_snapshot(snapshot)
    tb.background_color = [1.0, 1.0, 1.0, 1.0]
    tb.snap_to_pixel_centers = True
    tb.nerf.render_min_transmittance = 1e-4
    tb.shall_train = False
    tb.load_training_data(test_json)
    tb.render_with_lens_distortion = True
    return tb


def to_srgb(linear: np.ndarray) -> np.ndarray:
    """The sRGB transfer curve, [0, 1] -> [0, 1]."""
    linear = np.clip(linear, 0.0, 1.0)
    return np.where(linear <= 0.0031308, 12.92 * linear, 1.055 * np.power(linear, 1 / 2.4) - 0.055)
