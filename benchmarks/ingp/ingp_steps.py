"""instant-ngp (the anchor, ../shared/anchors/instant-ngp, never a dependency) trained to step counts, scored
our way: test PSNR at each count with a white background and one ray per pixel centre, as
``hvd_ngp.train``'s default protocol (and ``--eval_at_steps``), so the two stand side by side at equal steps.

Usage (on the GPU machine, after run_ingp.sh has unpacked the anchor into ROOT once):
    python3 ingp_steps.py ROOT TRAIN_JSON TEST_JSON 6000,30000 OUT.json
"""

import json
import os
import sys
import time

import numpy as np

root, train_json, test_json, counts, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
counts = sorted(int(c) for c in counts.split(","))
sys.path.insert(0, os.path.join(root, "build"))
import pyngp as ngp  # noqa: E402
from ingp_testbed import scoring_testbed, to_srgb, training_testbed  # noqa: E402


def score(snapshot: str) -> tuple[float, int]:
    """Mean PSNR over the test views: white background, one ray per pixel centre, sRGB, both images clipped."""
    tb = scoring_testbed(ngp, root, snapshot, test_json)
    psnrs = []
    for k in range(tb.nerf.training.dataset.n_images):
        w, h = tb.nerf.training.dataset.metadata[k].resolution
        tb.set_camera_to_training_view(k)
        tb.render_ground_truth = True
        ref = to_srgb(tb.render(w, h, 1, True)[..., :3])
        tb.render_ground_truth = False
        img = to_srgb(tb.render(w, h, 1, True)[..., :3])
        psnrs.append(-10.0 * np.log10(max(float(np.mean((img - ref) ** 2)), 1e-12)))
    return float(np.mean(psnrs)), len(psnrs)


tb = training_testbed(ngp, root, train_json)
result = {"steps": [], "train_s": [], "psnr_white_1spp": [], "views": 0}
seconds, snapshots = 0.0, []
for count in counts:
    while tb.training_step < count:
        t0 = time.perf_counter()
        tb.frame()
        seconds += time.perf_counter() - t0
    path = f"/tmp/ingp_steps_{count}.ingp"
    tb.save_snapshot(path, False)
    snapshots.append(path)
    result["steps"].append(int(tb.training_step))
    result["train_s"].append(round(seconds, 2))
    print(f"step {tb.training_step} after {seconds:.1f} s of training", flush=True)
del tb
for step, path in zip(result["steps"], snapshots):
    psnr, result["views"] = score(path)
    result["psnr_white_1spp"].append(psnr)
    print(f"step {step}: white/1spp {psnr:.2f} dB over {result['views']} views", flush=True)
json.dump(result, open(out, "w"), indent=1)
