"""instant-ngp's training throughput (the anchor, ../shared/anchors/instant-ngp, never a dependency): lego in
NeRF mode with its base config, trained ``WARM`` seconds, then timed over ``WINDOW`` more seconds. Samples
per step are its own counter ``measured_batch_size`` (the compacted samples a step trains on; the ray
count adapts so that it nears 2^18), read from a snapshot at both ends of the window, so its samples/s
compares with ``hvd_ngp.bench throughput``'s (samples through the network with gradients).

Usage (on the GPU machine, after the anchor is unpacked into ROOT; msgpack on PYTHONPATH):
    python3 ingp_rate.py ROOT TRAIN_JSON WARM WINDOW OUT.json
"""

import gzip
import json
import os
import sys
import time

root, train_json, warm, window, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
sys.path.insert(0, os.path.join(root, "build"))
import msgpack  # noqa: E402
import pyngp as ngp  # noqa: E402
from ingp_testbed import training_testbed  # noqa: E402


def counters(tb) -> dict:
    """The step and the rgb training counters of a snapshot written now."""
    path = "/tmp/ingp_rate.ingp"
    tb.save_snapshot(path, False)
    raw = open(path, "rb").read()
    data = msgpack.unpackb(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw, raw=False, strict_map_key=False)
    return {
        "step": int(tb.training_step),
        "rays_per_batch": int(find(data, "rays_per_batch")),
        "measured_batch_size": int(find(data, "measured_batch_size")),
    }


def find(tree, key: str):
    """The first value under ``key`` anywhere in a snapshot's nested maps (its layout differs by version)."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for value in tree.values():
            found = find(value, key)
            if found is not None:
                return found
    return None


tb = training_testbed(ngp, root, train_json)
t0 = time.perf_counter()
while time.perf_counter() - t0 < warm:
    tb.frame()
start = counters(tb)
seconds = 0.0
while seconds < window:
    t1 = time.perf_counter()
    tb.frame()
    seconds += time.perf_counter() - t1
end = counters(tb)
steps_per_s = (end["step"] - start["step"]) / seconds
samples_per_step = (start["measured_batch_size"] + end["measured_batch_size"]) / 2
result = {
    "start": start,
    "end": end,
    "window_s": round(seconds, 3),
    "steps_per_s": steps_per_s,
    "samples_per_step": samples_per_step,
    "samples_per_sec": steps_per_s * samples_per_step,
    "step_ms": 1e3 / steps_per_s,
}
print(
    f"instant-ngp: {steps_per_s:.1f} steps/s, {samples_per_step:.0f} samples/step "
    f"({start['measured_batch_size']} -> {end['measured_batch_size']}), "
    f"{result['samples_per_sec'] / 1e6:.2f} M samples/s, {result['step_ms']:.3f} ms/step, "
    f"rays/step {start['rays_per_batch']} -> {end['rays_per_batch']}, steps {start['step']} -> {end['step']}",
    flush=True,
)
json.dump(result, open(out, "w"), indent=1)
