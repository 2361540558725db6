#!/usr/bin/env bash
# The GPU benchmark suite, one step per call of a GPU machine (each fits in 10 minutes); benchmarks/README.md
# says what each step measures, what it needs staged, and how to read its table.
#   bash benchmarks/run.sh list                         # the steps
#   bash benchmarks/run.sh STEP OUT [-- TRAINER FLAGS]  # prints a table, writes OUT/<step>.json (and the runs' files)
# Data travel as git-ignored folders under .stage/ (filled on the development machine by `prepare`), copied to
# $HVD_NGP_STAGE (default /tmp/stage) on the GPU machine by `stage`. Trainer flags after `--` go to every
# training run of a step (a variant, or tiny flags for a CPU check). HVD_NGP_PYTHON: the interpreter (python3).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
S=${HVD_NGP_STAGE:-/tmp/stage}
PY=${HVD_NGP_PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
HERE=benchmarks

# name|what it measures (the first word of the second field says where it runs)
STEPS=(
  "prepare|development machine: fill .stage/ from ../shared (HVD_NGP_SHARED): lego as lossless WebP, fox, the instant-ngp anchor, wheels; HVD_NGP_OLD=<commit> adds that commit's tree for throughput's side-by-side"
  "colmap-poses|development machine: COLMAP poses for fox's photos (hvd-ngp-data process) -> .stage/fox/transforms_colmap.json"
  "stage|GPU machine: copy the carried .stage/ pieces to \$HVD_NGP_STAGE, install the carried wheels into /tmp/site"
  "gpu-tests|GPU: the GPU test files, one pytest each, HVD_NGP_REQUIRE_GPU=1 (HVD_NGP_TESTS: other files)"
  "throughput|GPU: bench throughput late in training (2000 warm-up steps), triton (and tcnn when importable); beside .stage/old when carried; HVD_NGP_ROUNDS (2)"
  "quality-vs-time|GPU: test PSNR against training seconds: HVD_NGP_SCENE (lego | fox | a path), HVD_NGP_SECONDS (60), evaluations at HVD_NGP_EVAL_S (15,30), seeds HVD_NGP_SEEDS (1337)"
  "against-instant-ngp|GPU: instant-ngp itself (the anchor) on the same machine: HVD_NGP_WHAT = lego (time budgets HVD_NGP_BUDGETS, 15,30,60) | fox | render (seconds per test view and PSNR, ours by both inference paths on a snapshot trained HVD_NGP_SECONDS, HVD_NGP_SCENE lego, lego20 or fox; HVD_NGP_PATHS: ours, from two_pass single_pass single_pass:ngp, all by default) | rate (samples/s) | steps (PSNR at HVD_NGP_STEPS, 6000,30000); ours beside it from quality-vs-time in the same OUT"
  "memory|GPU: lego 2000 steps under an 8 GiB memory budget and without one; bench memory (evaluation under budgets 0, 16, 8 GiB)"
  "scaling|GPUs: bench scaling on 1, 2, 4, 8 ranks (as the GPUs allow), weak and strong, time to 33/34/35 dB; Horovod from .whl_hvd"
  "batch|GPU: bench batch: steps to 33 and 35 dB (fox: 26-28 dB on its held-out photos; HVD_NGP_TARGETS) at K backward passes per step (K ranks' step on one device); gradient syncs HVD_NGP_MODES (every), HVD_NGP_PARALLEL runs at once (1), HVD_NGP_MAX_STEPS per run (no limit)"
  "syncmodes|GPU(s): bench syncmodes on a time budget: HVD_NGP_MODES (every,delayed_grid+fp16,delayed_grid+fp16+comp) on HVD_NGP_RANKS (1) ranks, seeds HVD_NGP_SEEDS (1337), HVD_NGP_SCENE (lego20) for HVD_NGP_SECONDS (60), CUDA graphs off for every mode"
  "inference|GPU: render speed of a trained snapshot: test views and orbit video frames per second (the load subtracted; PyAV from .whl_av)"
  "inference-sweep|GPU: render settings side by side in one process on the snapshot (HVD_NGP_SCENE, lego): benchmarks/inference_sweep.py, HVD_NGP_SETTINGS (PATH:LOG2_CHUNK:A:B[:SEGMENT[:STEPS[:MATH[:STOP[:UPDATE[:COUNT[:LOG2_ROWS]]]]]]],...; A:B the windows); HVD_NGP_PROFILE=N: N views of the last setting profiled (HVD_NGP_TRACE=1: its timeline in OUT/trace.json.gz)"
  "export|GPU: the snapshot's marching-cubes mesh and its silhouette IoU on lego's test views, its point cloud, PNG pictures of both (mesh.png, points.png; trimesh etc. from .whl_look)"
  "browser|GPU: the snapshot viewer's page in headless Chromium (HVD_NGP_CHROMIUM: benchmarks/chromium/README.md) against the render tool's image of the first test view (bench pagecheck)"
  "viewer|GPU: bench viewer: training steps/s with a watcher against without: headless Chromium, else (none found) the python camera client; viser from .whl_view"
  "colmap|GPU: fox on a time budget with the shipped poses and with COLMAP's (colmap-poses), the same held-out views"
)

die() { echo "benchmarks/run.sh: $1" >&2; exit "${2:-2}"; }
usage() { for s in "${STEPS[@]}"; do printf '  %-20s %s\n' "${s%%|*}" "${s#*|}"; done; }
step=${1:-}
[[ -n $step ]] || { echo "usage: bash benchmarks/run.sh STEP OUT [-- TRAINER FLAGS]"; usage; exit 2; }
if [[ $step == list ]]; then usage; exit 0; fi
known=0; for s in "${STEPS[@]}"; do [[ ${s%%|*} == "$step" ]] && known=1; done
((known)) || die "unknown step '$step' (bash benchmarks/run.sh list)"
shift
out=; [[ ${1:-} != -- && -n ${1:-} ]] && { out=$1; shift; }
[[ ${1:-} == -- ]] && shift
flags=("$@")  # trainer flags for every run of this step
case $step in prepare|colmap-poses|stage) ;; *) [[ -n $out ]] || die "$step: give the OUT folder"; esac
[[ -n $out ]] && { mkdir -p "$out" || die "$step: cannot create $out"; }

tables() { "$PY" "$HERE/tables.py" "$@"; }
scene_of() {  # NAME -> the scene argument: lego and fox from the stage (checked), else as given (builtin, a path)
  case $1 in
    lego) local train test
      train=$(count "$S/lego/train"); test=$(count "$S/lego/test")
      ((train == 100 && test == 200)) || die "lego is not staged in $S (train $train of 100, test $test of 200): carry .stage/lego (train, test_a, transforms_*.json in one call, test_b in the next) and run the stage step" 3
      echo "$S/lego" ;;
    lego20) local train test  # lego's 100 training views and every 10th test view: one call carries it (37 MB)
      train=$(count "$S/lego20/train"); test=$(count "$S/lego20/test")
      ((train == 100 && test == 20)) || die "lego20 is not staged in $S (train $train of 100, test $test of 20): carry .stage/lego20 and run the stage step" 3
      echo "$S/lego20" ;;
    fox) [[ -f $S/fox/transforms.json ]] || die "fox is not staged in $S: carry .stage/fox and run the stage step" 3
      echo "$S/fox" ;;
    *) echo "$1" ;;
  esac
}
holdout() { [[ $1 == fox ]] && echo "--holdout_every 8"; }  # fox has no test split: every 8th photo held out
train() { "$PY" -m hvd_ngp.train --log_every 4000 --save_renders 0 "$@" "${flags[@]}"; }
snapshot() {  # the snapshot inference and export read: HVD_NGP_SNAP, else HVD_NGP_SCENE (lego) trained HVD_NGP_SECONDS (60) once
  snap=${HVD_NGP_SNAP:-$S/snap_$(basename "${HVD_NGP_SCENE:-lego}")_${HVD_NGP_SECONDS:-60}s.pt}
  [[ -f $snap ]] && return
  local scene; scene=$(scene_of "${HVD_NGP_SCENE:-lego}") || exit $?
  # shellcheck disable=SC2046
  train --scene "$scene" $(holdout "${HVD_NGP_SCENE:-lego}") --time_budget_s "${HVD_NGP_SECONDS:-60}" --n_eval_views 1 --out_dir "$out/snapshot_run" \
    --save_snapshot "$snap" >"$out/snapshot_run.log" 2>&1 || { tail -5 "$out/snapshot_run.log"; die "training the snapshot failed" 1; }
}
png_stage() {  # instant-ngp reads PNG: lego's (or $1's: lego20) WebP stage written back as PNG in $S/<name>_png
  "$PY" - "$S" "${1:-lego}" <<'PY'
import pathlib, sys, cv2
src, dst = pathlib.Path(sys.argv[1], sys.argv[2]), pathlib.Path(sys.argv[1], f"{sys.argv[2]}_png")
for split in ("train", "test"):
    (dst / split).mkdir(parents=True, exist_ok=True)
    for f in (src / split).glob("*.webp"):
        if not (dst / split / f"{f.stem}.png").exists():
            cv2.imwrite(str(dst / split / f"{f.stem}.png"), cv2.imread(str(f), cv2.IMREAD_UNCHANGED))
    (dst / f"transforms_{split}.json").write_text((src / f"transforms_{split}.json").read_text())
PY
}
fox_split() {  # instant-ngp's fox splits as --holdout_every 8 draws them: $S/fox/transforms_ingp_{train,test}.json
  "$PY" - "$S/fox" <<'PY'
import json, os, sys
root = sys.argv[1]; tf = json.load(open(f"{root}/transforms.json"))
frames = [f for f in tf["frames"] if os.path.isfile(os.path.join(root, f["file_path"]))]  # some photos are absent
for name, keep in (("train", lambda i: i % 8 != 0), ("test", lambda i: i % 8 == 0)):  # as --holdout_every 8
    json.dump({**tf, "frames": [f for i, f in enumerate(frames) if keep(i)]}, open(f"{root}/transforms_ingp_{name}.json", "w"))
PY
}
ingp_env() {  # the anchor unpacked once into $root; its CUDA libraries on the path
  root=/tmp/ingp/instant-ngp
  [[ -f $S/ingp/run_ingp.sh ]] || die "the instant-ngp anchor is not staged: carry .stage/ingp and run the stage step" 3
  if [[ ! -f $root/build/pyngp.cpython-312-x86_64-linux-gnu.so ]]; then
    mkdir -p /tmp/ingp "$root/build" && tar xzf "$S"/ingp/instant-ngp-*-src.tar.gz -C /tmp/ingp
    gunzip -c "$S/ingp/pyngp.cpython-312-x86_64-linux-gnu.so.gz" >"$root/build/pyngp.cpython-312-x86_64-linux-gnu.so"
  fi
  local cuda; cuda="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  export LD_LIBRARY_PATH="$cuda/lib64:$cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
count() { find "$1" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }  # entries of a folder (0 when absent)
seconds_of() { local t0=$1; "$PY" -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 3))" "$t0"; }

case $step in
  prepare)
    src=${HVD_NGP_SHARED:-../shared}
    [[ -d $src/data/nerf_synthetic/lego ]] || die "prepare: no $src/data/nerf_synthetic/lego (HVD_NGP_SHARED: the shared folder)" 3
    "$PY" - "$src" <<'PY'
import os, shutil, sys, cv2
src, dst = os.path.join(sys.argv[1], "data/nerf_synthetic/lego"), ".stage/lego"
for split, parts in (("train", ("train",)), ("test", ("test_a", "test_b"))):
    names = sorted(n for n in os.listdir(f"{src}/{split}") if n.endswith(".png"))
    for k, part in enumerate(parts):
        os.makedirs(f"{dst}/{part}", exist_ok=True)
        for name in names[k::len(parts)]:
            img = cv2.imread(f"{src}/{split}/{name}", cv2.IMREAD_UNCHANGED)
            img[img[..., 3] == 0, :3] = 0  # lossless WebP: pixels with alpha 0 zeroed (composited away anyway)
            cv2.imwrite(f"{dst}/{part}/{name[:-4]}.webp", img, [cv2.IMWRITE_WEBP_QUALITY, 101])
    shutil.copy(f"{src}/transforms_{split}.json", f"{dst}/transforms_{split}.json")
# lego20: the 100 training views and every 10th test view (r_0, r_10, ...), small enough for one call
import json
shutil.rmtree(".stage/lego20", ignore_errors=True)
shutil.copytree(f"{dst}/train", ".stage/lego20/train")
shutil.copy(f"{dst}/transforms_train.json", ".stage/lego20/transforms_train.json")
test = json.load(open(f"{dst}/transforms_test.json"))
test["frames"] = [f for f in test["frames"] if int(f["file_path"].rsplit("_", 1)[1]) % 10 == 0]
os.makedirs(".stage/lego20/test")
for f in test["frames"]:
    name = os.path.basename(f["file_path"]) + ".webp"
    part = next(p for p in ("test_a", "test_b") if os.path.exists(f"{dst}/{p}/{name}"))
    shutil.copy(f"{dst}/{part}/{name}", f".stage/lego20/test/{name}")
json.dump(test, open(".stage/lego20/transforms_test.json", "w"), indent=1)
PY
    rm -rf .stage/fox .stage/ingp && cp -r "$src/data/fox" .stage/fox && cp -r "$src/anchors/instant-ngp" .stage/ingp
    dl() { local dir=$1; shift; mkdir -p "$dir" && "$PY" -m pip download -q --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d "$dir" "$@"; }
    dl .whl configargparse msgpack                                # what the GPU image lacks
    dl .whl_look trimesh PyMCubes rtree embreex scipy              # export (about 35 MB: carry it alone)
    dl .whl_av av                                                  # inference's orbit video: H.264 (about 36 MB)
    # the viewer: viser and what it imports that the image lacks (numpy, typing_extensions and OpenCV, which
    # encodes the frames, it has; imageio, trimesh, requests, tqdm are imported only off our path): about 11 MB
    dl .whl_view viser==1.1.1 websockets==16.1.1 msgspec==0.23.0 rich==14.3.4 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0  # as tested
    dl .whl_view --platform manylinux2014_x86_64 zstandard==0.25.0   # no manylinux_2_28 wheel of it
    mkdir -p .whl_tcnn .whl_hvd && cp "$src"/wheels/tinycudann-*.whl .whl_tcnn/ 2>/dev/null
    cp "$src"/wheels/horovod-*-cp312-*.whl .whl_hvd/ 2>/dev/null  # scaling: Horovod with NCCL
    if [[ -n ${HVD_NGP_OLD:-} ]]; then rm -rf .stage/old && mkdir -p .stage/old && git archive "$HVD_NGP_OLD" | tar -x -C .stage/old; fi
    du -sh .stage/* .stage/lego/* .whl* 2>/dev/null
    ;;
  colmap-poses)
    [[ -d .stage/fox/images ]] || die "colmap-poses: run prepare first (.stage/fox)" 3
    tmp=$(mktemp -d) && nice -n 10 "$PY" -m hvd_ngp.data process --images .stage/fox/images --out "$tmp/fox" \
      --colmap_size 480 --quiet && cp "$tmp/fox/transforms.json" .stage/fox/transforms_colmap.json
    rm -rf "$tmp"
    "$PY" -m hvd_ngp.tools.pose_check .stage/fox/transforms_colmap.json .stage/fox/transforms.json
    ;;
  stage)
    mkdir -p "$S/lego/test" /tmp/site
    [[ -d .stage/lego/train ]] && cp -r .stage/lego/train .stage/lego/transforms_*.json "$S/lego/"
    for part in test_a test_b; do [[ -d .stage/lego/$part ]] && cp .stage/lego/$part/* "$S/lego/test/"; done
    for d in lego20 fox ingp old; do [[ -d .stage/$d ]] && rm -rf "${S:?}/$d" && cp -r ".stage/$d" "$S/"; done
    for w in .whl .whl_tcnn .whl_hvd .whl_look .whl_av .whl_view; do
      ls $w/*.whl >/dev/null 2>&1 && "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $w/*.whl
    done
    echo "staged in $S: lego train $(count "$S/lego/train"), test $(count "$S/lego/test");" \
      "fox $(count "$S/fox/images") photos; anchor $([[ -d $S/ingp ]] && echo yes || echo no);" \
      "old tree $([[ -d $S/old ]] && echo yes || echo no); /tmp/site: $(find /tmp/site -maxdepth 1 -name '*.dist-info' | wc -l) packages"
    ;;
  gpu-tests)
    files=${HVD_NGP_TESTS:-tests/test_kernels.py tests/test_infer.py tests/test_mlp_kernels.py tests/test_graphed.py tests/test_ahead.py tests/test_encoding.py tests/test_render.py tests/test_memory.py tests/test_evaluation.py tests/test_failures.py tests/test_observability_gpu.py}
    logs=()
    for f in $files; do
      log=$out/pytest_$(basename "$f" .py).log; logs+=("$log")
      HVD_NGP_REQUIRE_GPU=1 HVD_NGP_SHARED_DATA=$S timeout "${HVD_NGP_TEST_TIMEOUT:-300}" "$PY" -m pytest -q \
        -p no:cacheprovider "$f" >"$log" 2>&1
    done
    tables pytest "$out" gpu_tests "${logs[@]}"
    ;;
  throughput)  # late in training: 2000 warm-up steps, 200 timed x 3; round 1 profiled (kernels, launches)
    scene=$(scene_of "${HVD_NGP_SCENE:-lego}") || exit $?
    backends=triton; "$PY" -c 'import tinycudann' 2>/dev/null && backends=triton,tcnn
    trees=(new); [[ -d $S/old ]] && trees=(old new)
    files=(); extra=(); ((${#flags[@]})) && extra=(-- "${flags[@]}")
    for round in $(seq "${HVD_NGP_ROUNDS:-2}"); do
      for tree in "${trees[@]}"; do
        dir=$PWD; [[ $tree == old ]] && dir=$S/old
        name=throughput_${tree}_$round; files+=("$out/$name.json")
        (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout "${HVD_NGP_BENCH_TIMEOUT:-200}" "$PY" -m hvd_ngp.bench throughput \
          --scene "$scene" --backends "$backends" --warmup_steps "${HVD_NGP_WARMUP:-2000}" --steps 200 --repeat 3 \
          --no_compile --profile_steps $((round == 1 ? 16 : 0)) --json "$out/$name.json" \
          "${extra[@]}" >"$out/$name.log" 2>&1) || { tail -5 "$out/$name.log"; }
      done
    done
    tables throughput "$out" throughput "${files[@]}"
    ;;
  quality-vs-time)
    name=${HVD_NGP_SCENE:-lego}; scene=$(scene_of "$name") || exit $?
    secs=${HVD_NGP_SECONDS:-60}; evals=${HVD_NGP_EVAL_S-15,30}
    for seed in ${HVD_NGP_SEEDS:-1337}; do
      run=quality_$(basename "$name")_${secs}s_$seed
      # shellcheck disable=SC2046
      train --scene "$scene" $(holdout "$name") --time_budget_s "$secs" ${evals:+--eval_at_s "$evals"} --seed "$seed" \
        --out_dir "$out/$run" >"$out/$run.log" 2>&1 || tail -5 "$out/$run.log"
      rm -rf "$out/$run/checkpoints"
    done
    tables runs "$out" "quality_$(basename "$name")" "quality_$(basename "$name")_*"
    ;;
  against-instant-ngp)
    what=${HVD_NGP_WHAT:-lego}
    ingp_env
    case $what in
      lego)
        scene_of lego >/dev/null || exit 3
        png_stage
        bash "$S/ingp/run_ingp.sh" "$S/lego_png/transforms_train.json" "$S/lego_png/transforms_test.json" \
          "${HVD_NGP_BUDGETS:-15,30,60}" "$out/ingp_lego_raw.json" 2>&1 | grep --line-buffered -E "budget|dB|rror"
        tables ingp "$out" ingp_lego "$out/ingp_lego_raw.json" "$out/quality_lego.json" ;;
      fox)
        scene_of fox >/dev/null || exit 3
        fox_split
        bash "$S/ingp/run_ingp.sh" "$S/fox/transforms_ingp_train.json" "$S/fox/transforms_ingp_test.json" \
          "${HVD_NGP_BUDGETS:-15,30,60}" "$out/ingp_fox_raw.json" 2>&1 | grep --line-buffered -E "budget|dB|rror"
        tables ingp "$out" ingp_fox "$out/ingp_fox_raw.json" "$out/quality_fox.json" ;;
      render)  # render time of the test views: ours (both inference paths) on a snapshot trained as long as instant-ngp
        name=${HVD_NGP_SCENE:-lego}
        case $name in
          lego|lego20) scene_of "$name" >/dev/null || exit 3; png_stage "$name"
            train_json=$S/${name}_png/transforms_train.json; test_json=$S/${name}_png/transforms_test.json ;;
          fox) scene_of fox >/dev/null || exit 3; fox_split; train_json=$S/fox/transforms_ingp_train.json; test_json=$S/fox/transforms_ingp_test.json ;;
          *) die "against-instant-ngp render: HVD_NGP_SCENE is lego, lego20 or fox, not '$name'" ;;
        esac
        snapshot
        files=()
        # ours: both paths as the snapshot marches, then single_pass as instant-ngp renders (its 1024 steps per
        # diagonal and its stop at transmittance 0.01, testbed.h's render_min_transmittance)
        for run in ${HVD_NGP_PATHS:-two_pass single_pass single_pass:ngp}; do  # one view first: kernels compile outside the timed run
          path=${run%%:*}; name=${run/:/_}; marching=()
          [[ $run == *:ngp ]] && marching=(--marching '{"eval_steps_per_diagonal": 1024, "early_termination": 0.01}')
          for views in 1 -1; do
            "$PY" -m hvd_ngp.render --load_snapshot "$snap" --split_views "$views" --video none --inference "$path" \
              "${marching[@]}" --out_dir "/tmp/render_$name" >"$out/render_$name.log" 2>&1 \
              || { tail -5 "$out/render_$name.log"; die "render ($run) failed" 1; }
          done
          cp "/tmp/render_$name/render.json" "$out/render_$name.json" && files+=("$out/render_$name.json")
        done
        repo=$PWD
        (cd "$root" && timeout 300 /opt/torch/.venv/bin/python3 "$repo/$HERE/ingp/ingp_render.py" "$root" "$train_json" "$test_json" \
          "${HVD_NGP_SECONDS:-60}" "$out/ingp_render.json" 2>&1 | tr "\r" "\n" | grep --line-buffered -E "^\{|rror")
        tables renders "$out" "render_$name" "$out/ingp_render.json" "${files[@]}" ;;
      rate)  # samples per second in steady state: 20 s warm, 20 s timed (its own counters)
        scene_of lego >/dev/null || exit 3
        png_stage; repo=$PWD
        (cd "$root" && timeout 120 /opt/torch/.venv/bin/python3 "$repo/$HERE/ingp/ingp_rate.py" "$root" \
          "$S/lego_png/transforms_train.json" 20 20 "$out/ingp_rate.json" 2>&1 | tr "\r" "\n" | grep --line-buffered -E "^instant|rror")
        tables fields "$out" ingp_rate "$out/ingp_rate.json" ;;
      steps)  # PSNR at equal steps, scored as our evaluations score
        scene_of lego >/dev/null || exit 3
        png_stage; repo=$PWD
        (cd "$root" && /opt/torch/.venv/bin/python3 "$repo/$HERE/ingp/ingp_steps.py" "$root" "$S/lego_png/transforms_train.json" \
          "$S/lego_png/transforms_test.json" "${HVD_NGP_STEPS:-6000,30000}" "$out/ingp_steps.json" 2>&1 | tr "\r" "\n" \
          | grep --line-buffered -E "^step|rror")
        tables fields "$out" ingp_steps "$out/ingp_steps.json" ;;
      *) die "against-instant-ngp: HVD_NGP_WHAT is lego, fox, render, rate or steps, not '$what'" ;;
    esac
    ;;
  memory)
    scene=$(scene_of "${HVD_NGP_SCENE:-lego}") || exit $?
    for cap in 8 0; do
      train --scene "$scene" --n_steps "${HVD_NGP_STEPS:-2000}" --gpu_memory_gb $cap --out_dir "$out/memory_cap$cap" \
        >"$out/memory_cap$cap.log" 2>&1 || tail -5 "$out/memory_cap$cap.log"
      rm -rf "$out/memory_cap$cap/checkpoints"
    done
    "$PY" -m hvd_ngp.bench memory --scene "$scene" --n_steps "${HVD_NGP_STEPS:-2000}" --budgets 0,16,8 \
      --json "$out/bench_memory.json" 2>&1 | tail -8
    tables runs "$out" memory "memory_cap*"
    ;;
  scaling)
    scene=$(scene_of "${HVD_NGP_SCENE:-lego}") || exit $?
    n=$(nvidia-smi -L 2>/dev/null | wc -l); ranks=1; for k in 2 4 8; do ((k <= n)) && ranks=$ranks,$k; done
    secs=${HVD_NGP_SECONDS:-90}
    timeout 540 "$PY" -m hvd_ngp.bench scaling --ranks "${HVD_NGP_RANKS:-$ranks}" --mode both --psnr_targets 33,34,35 \
      --out_dir "$out/scaling_runs" --json "$out/scaling.json" --note "$n GPUs of one host, $(basename "$scene")" \
      -- --scene "$scene" --n_steps 1000000 --time_budget_s "$secs" --eval_at_s "15,30,60,$secs" --log_every 2000 \
      --save_renders 0 "${flags[@]}" 2>&1 | tail -30
    rm -rf "$out"/scaling_runs/*/renders "$out"/scaling_runs/*/checkpoints
    [[ -f $out/scaling.json ]] || die "scaling: bench scaling wrote no $out/scaling.json" 1
    ;;
  batch)
    scene=$(scene_of "${HVD_NGP_SCENE:-lego}") || exit $?
    # fox: its held-out photos (every 8th), and targets around its 60 s PSNR (28 dB on them)
    targets=33,35; [[ ${HVD_NGP_SCENE:-lego} == fox ]] && targets=26,27,28
    # shellcheck disable=SC2046
    timeout 560 "$PY" -m hvd_ngp.bench batch --ks "${HVD_NGP_KS:-1,2,4,8}" --seeds "${HVD_NGP_SEEDS:-1337}" \
      --modes "${HVD_NGP_MODES:-every}" --parallel "${HVD_NGP_PARALLEL:-1}" --max_steps "${HVD_NGP_MAX_STEPS:-0}" \
      --psnr_targets "${HVD_NGP_TARGETS:-$targets}" --eval_every 2000 --n_eval_views 5 --budget_s "${HVD_NGP_BUDGET_S:-420}" \
      --out_dir "$out/batch_runs" --json "$out/batch_raw.json" -- --scene "$scene" $(holdout "${HVD_NGP_SCENE:-lego}") "${flags[@]}" 2>&1 | tail -12
    tables rows "$out" batch "$out/batch_raw.json" runs
    ;;
  syncmodes)  # one seed per call fits 10 minutes (three 60 s runs with start-up and evaluation)
    scene=$(scene_of "${HVD_NGP_SCENE:-lego20}") || exit $?
    timeout 580 "$PY" -m hvd_ngp.bench syncmodes --device "${HVD_NGP_DEVICE:-cuda}" --ranks "${HVD_NGP_RANKS:-1}" \
      --modes "${HVD_NGP_MODES:-every,delayed_grid+fp16,delayed_grid+fp16+comp}" --seeds "${HVD_NGP_SEEDS:-1337}" \
      --out_dir "$out/syncmodes_runs" --json "$out/syncmodes.json" -- --scene "$scene" \
      --time_budget_s "${HVD_NGP_SECONDS:-60}" --cuda_graphs off --log_every 4000 "${flags[@]}" 2>&1 | tail -12
    rm -rf "$out"/syncmodes_runs/*/checkpoints
    [[ -f $out/syncmodes.json ]] || die "syncmodes: bench syncmodes wrote no $out/syncmodes.json" 1
    ;;
  inference)  # the snapshot's load alone, then + N test views, then + an orbit of N frames: the differences are rendering
    snapshot
    scene=$(scene_of "${HVD_NGP_SCENE:-lego}") || exit $?
    views=${HVD_NGP_VIEWS:-50}; frames=${HVD_NGP_FRAMES:-60}
    declare -A took=()
    for what in load views video; do
      args=(--split_views 0 --video none)
      [[ $what == views ]] && args=(--split_views "$views" --video none)
      [[ $what == video ]] && args=(--split_views 0 --video orbit --n_frames "$frames")
      t0=$("$PY" -c 'import time; print(time.time())')
      "$PY" -m hvd_ngp.render --load_snapshot "$snap" --scene "$scene" "${args[@]}" --out_dir "/tmp/inference_$what" \
        >"$out/inference_$what.log" 2>&1 || { tail -5 "$out/inference_$what.log"; die "inference: render ($what) failed" 1; }
      took[$what]=$(seconds_of "$t0")
    done
    "$PY" - "$out" "${took[load]}" "${took[views]}" "${took[video]}" "$views" "$frames" /tmp/inference_views/render.json <<'PY'
import json, sys
out, load, views_s, video_s, views, frames, render = sys.argv[1], *map(float, sys.argv[2:5]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
r = json.load(open(render))
json.dump({"load_s": load, "test_views": views, "test_views_per_s": round(views / max(views_s - load, 1e-9), 2),
           "test_psnr": r.get("test_psnr"), "video_frames": frames,
           "video_frames_per_s": round(frames / max(video_s - load, 1e-9), 2)}, open(f"{out}/inference_raw.json", "w"))
PY
    tables fields "$out" inference "$out/inference_raw.json"
    ;;
  inference-sweep)
    snapshot
    "$PY" benchmarks/inference_sweep.py "$snap" --json "$out/inference_sweep.json" ${HVD_NGP_SETTINGS:+--settings "$HVD_NGP_SETTINGS"} \
      ${HVD_NGP_PROFILE:+--profile "$HVD_NGP_PROFILE"} ${HVD_NGP_TRACE:+--trace "$out/trace.json"} 2>&1 \
      | grep -vE "view/s|^test views"
    if [[ -f $out/trace.json ]]; then gzip -f "$out/trace.json"; fi
    ;;
  export)
    snapshot
    scene=$(scene_of "${HVD_NGP_SCENE:-lego}") || exit $?
    exported() {  # LOG COMMAND ARGS...: one hvd-ngp-export run, its output in $out/export_LOG.log
      local log=$out/export_$1.log; shift
      "$PY" -m hvd_ngp.tools.export "$@" --scene "$scene" >"$log" 2>&1 \
        || { tail -3 "$log"; die "export: hvd-ngp-export $1 failed ($log)" 1; }
    }
    exported mesh mesh "$snap" --out "$out/mesh.ply"
    exported iou iou "$snap" --mesh "$out/mesh.ply" --json "$out/iou.json"
    exported pointcloud pointcloud "$snap" --out "$out/points.ply"
    # pictures of both from the first test view (the first training view when the scene has no test split)
    exported mesh_picture picture "$out/mesh.ply" --out "$out/mesh.png" --json "$out/mesh_picture.json"
    exported points_picture picture "$out/points.ply" --out "$out/points.png" --json "$out/points_picture.json"
    tables fields "$out" export "$out/iou.json" "$out/mesh_picture.json" "$out/points_picture.json"
    ;;
  browser)
    snapshot
    "$PY" -m hvd_ngp.bench pagecheck "$snap" --device "${HVD_NGP_DEVICE:-cuda}" --downscale "${HVD_NGP_DOWNSCALE:-4}" \
      --out_dir "$out/page" --json "$out/page.json" 2>&1 | grep -vE "view/s|it/s" | tail -3
    rm -rf "$out/page/render"
    [[ -f $out/page.json ]] || die "browser: bench pagecheck wrote no $out/page.json" 1
    tables fields "$out" browser "$out/page.json"
    ;;
  viewer)
    scene=$(scene_of "${HVD_NGP_SCENE:-lego}") || exit $?
    client=${HVD_NGP_CLIENT:-}
    if [[ -z $client ]]; then
      if "$PY" -c "import shutil, sys; from hvd_ngp.viewer.browser import find_chromium as f; sys.exit(not shutil.which(f() or '-'))"; then
        client=chromium
      else
        client=python
        echo "viewer: no Chromium found: the watcher is the python camera client (hvd_ngp/viewer/probe.py: a browser's camera messages, no decoding or drawing)"
      fi
    fi
    "$PY" -m hvd_ngp.bench viewer --client "$client" --json "$out/viewer_raw.json" -- --scene "$scene" --n_steps "${HVD_NGP_STEPS:-3000}" \
      "${flags[@]}" 2>&1 | tail -8
    [[ -f $out/viewer_raw.json ]] || die "viewer: bench viewer wrote no $out/viewer_raw.json" 1
    tables fields "$out" viewer "$out/viewer_raw.json"
    ;;
  colmap)
    scene=$(scene_of fox) || exit $?
    [[ -f $S/fox/transforms_colmap.json ]] || die "colmap: no $S/fox/transforms_colmap.json (colmap-poses, then stage)" 3
    for seed in ${HVD_NGP_SEEDS:-1337}; do
      for poses in shipped colmap; do
        s=$scene; [[ $poses == colmap ]] && s=$scene/transforms_colmap.json
        train --scene "$s" --holdout_every 8 --time_budget_s "${HVD_NGP_SECONDS:-60}" --seed "$seed" \
          --out_dir "$out/colmap_${poses}_$seed" >"$out/colmap_${poses}_$seed.log" 2>&1 || tail -5 "$out/colmap_${poses}_$seed.log"
        rm -rf "$out/colmap_${poses}_$seed/checkpoints"
      done
    done
    tables runs "$out" colmap "colmap_*"
    ;;
esac
