"""instant-ngp (the anchor, ../shared/anchors/instant-ngp, never a dependency) trained for a wall-clock budget,
then its render time on the test views, scored our way (white background, one ray per pixel centre, sRGB), so
``hvd-ngp-render``'s seconds per view and PSNR on a snapshot trained as long stand beside it.

Each view is rendered once untimed (the ground truth pass loads it) and once timed; ``tb.render`` returns a host
array, so the time includes the copy back, as ours does.

Usage (on the GPU machine, after run_ingp.sh or benchmarks/run.sh has unpacked the anchor into ROOT once):
    python3 ingp_render.py ROOT TRAIN_JSON TEST_JSON SECONDS OUT.json
"""

import json
import os
import sys
import time

import numpy as np

root, train_json, test_json, seconds, out = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
sys.path.insert(0, os.path.join(root, "build"))
import pyngp as ngp  # noqa: E402
from ingp_testbed import scoring_testbed, to_srgb, training_testbed  # noqa: E402

tb = training_testbed(ngp, root, train_json)
trained = 0.0
while trained < seconds:
    t0 = time.perf_counter()
    tb.frame()
    trained += time.perf_counter() - t0
snapshot = "/tmp/ingp_render.ingp"
tb.save_snapshot(snapshot, False)
steps = tb.training_step
del tb

tb = scoring_testbed(ngp, root, snapshot, test_json)
psnrs, render_s = [], []
for k in range(tb.nerf.training.dataset.n_images):
    w, h = tb.nerf.training.dataset.metadata[k].resolution
    tb.set_camera_to_training_view(k)
    tb.render_ground_truth = True
    ref = to_srgb(tb.render(w, h, 1, True)[..., :3])
    tb.render_ground_truth = False
    t0 = time.perf_counter()
    img = tb.render(w, h, 1, True)
    render_s.append(time.perf_counter() - t0)
    psnrs.append(-10.0 * np.log10(max(float(np.mean((to_srgb(img[..., :3]) - ref) ** 2)), 1e-12)))
result = {
    "what": "instant-ngp render",
    "train_s": round(trained, 2),
    "steps": steps,
    "views": len(psnrs),
    "resolution": [int(w), int(h)],
    "psnr_white_1spp": round(float(np.mean(psnrs)), 3),
    "render_s_total": round(sum(render_s), 3),
    "seconds_per_view": round(sum(render_s) / len(render_s), 4),
    "seconds_per_view_after_first": round(sum(render_s[1:]) / max(len(render_s) - 1, 1), 4),
}
print(json.dumps(result), flush=True)
json.dump(result, open(out, "w"), indent=1)
