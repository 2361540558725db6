#!/usr/bin/env bash
# One-shot, idempotent set-up for hvd_ngp on a fresh Debian/Ubuntu machine (CPU or GPU).
#
#   bash scripts/setup.sh            # creates .venv, builds Horovod once, installs hvd_ngp editable
#
# Environment knobs:
#   HVD_NGP_VENV            virtual environment path (default: <repo>/.venv)
#   HVD_NGP_CACHE           cache for built Horovod wheels (default: ~/.cache/hvd_ngp)
#   HVD_NGP_HOROVOD_SDIST   local horovod-0.28.1.tar.gz for air-gapped clusters (default: download from PyPI)
#   HVD_NGP_SKIP_APT=1      do not touch system packages (you installed OpenMPI, cmake, g++ yourself)
#   HVD_NGP_TORCH           torch requirement when no torch is installed (default: torch==2.13.0)
#   HVD_NGP_SYSTEM_SITE=1   create the venv with --system-site-packages (reuse a cluster's CUDA torch)
#   HVD_NGP_EXTRAS          extra pip requirements installed into the venv (e.g. "triton==3.6.0")
#   HVD_NGP_WHEELHOUSE      air-gapped: install from this folder only (pip --no-index --find-links DIR);
#                           fill it on a connected machine with scripts/wheelhouse.sh DIR
#   HVD_NGP_TCNN_SRC        GPU nodes: build tinycudann from this tiny-cuda-nn source tree or .tar.gz
#                           (with its submodules), cached like Horovod
#   HVD_NGP_CUDA_ARCHS      GPU architectures to build for, e.g. "90" or "80;90" (default: the GPUs present)
#   HVD_NGP_DOCTOR=1        run hvd-ngp-doctor at the end on a CPU machine too (always on a GPU machine),
#                           and on a run that finds everything already set up
#   HVD_NGP_BROWSER=1       also install Debian's chromium (the web viewer's headless-browser test; CI sets it)
#   HVD_NGP_FORCE=1         run every step although a previous run's stamp says all is set up
# On a GPU machine whose default compiler is not the system's (e.g. /opt/gcc), the GPU extensions are
# built with CC=/usr/bin/gcc CXX=/usr/bin/g++ (a torch extension built with /opt/gcc segfaulted inside
# its libstdc++ on our GPU image); set CC/CXX yourself to choose another.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HVD_NGP_VENV:-$ROOT/.venv}"
CACHE="${HVD_NGP_CACHE:-$HOME/.cache/hvd_ngp}"
HOROVOD_VERSION=0.28.1
TORCH_REQ="${HVD_NGP_TORCH:-torch==2.13.0}"

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- system packages
apt_packages=(openmpi-bin libopenmpi-dev cmake g++ make python3-venv python3-dev iproute2)
# optional: a headless browser for tests/test_viewer.py (skipped without one)
[[ "${HVD_NGP_BROWSER:-0}" == "1" ]] && apt_packages+=(chromium)
if [[ "${HVD_NGP_SKIP_APT:-0}" != "1" ]] && command -v dpkg-query >/dev/null; then
  missing=()
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # python3-venv/-dev only matter for the distribution's own python; a pyenv/conda python has its own.
  if python3 -c 'import venv, sysconfig, os; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null; then
    missing=("${missing[@]/python3-venv}"); missing=("${missing[@]/python3-dev}")
  fi
  read -r -a missing <<<"${missing[*]:-}"
  if ((${#missing[@]})); then
    log "installing system packages: ${missing[*]}"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi
command -v mpicc >/dev/null || die "mpicc not found: install OpenMPI (apt-get install openmpi-bin libopenmpi-dev) or load your cluster's MPI module"
command -v cmake >/dev/null || die "cmake not found: apt-get install cmake"

# ---------------------------------------------------------------- virtual environment
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating virtual environment $VENV"
  if [[ "${HVD_NGP_SYSTEM_SITE:-0}" == "1" ]]; then
    python3 -m venv --system-site-packages "$VENV"
  else
    python3 -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
if [[ "${HVD_NGP_SYSTEM_SITE:-0}" == "1" ]]; then
  # python3 may itself run in an environment (a site torch in /opt/torch/.venv, a conda env): then
  # --system-site-packages reaches only the base interpreter's packages. Chain that environment's
  # site-packages behind the venv's own with a .pth file.
  PARENT_SITE="$(python3 -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')"
  if [[ -n "$PARENT_SITE" ]]; then
    CHILD_SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    printf '%s\n' "$PARENT_SITE" >"$CHILD_SITE/_hvd_ngp_parent_site.pth"
    log "python3 runs in the environment $(python3 -c 'import sys; print(sys.prefix)'): its packages are reused ($CHILD_SITE/_hvd_ngp_parent_site.pth)"
  fi
fi
# ---------------------------------------------------------------- already set up? (one check, seconds)
# A run that got to the end leaves a stamp: a digest of this script, the requirements, setup.cfg and the
# knobs above. When it matches, one Python process checks what the steps below would make sure of
# (torch, mpi4py, triton, Horovod's version, this checkout installed, the CPU kernel, tinycudann when
# asked) instead of a dozen processes importing torch; HVD_NGP_FORCE=1 runs every step anyway.
STAMP="$VENV/.hvd_ngp_setup_stamp"
STAMP_KEY="$({ cat "$ROOT/scripts/setup.sh" "$ROOT/scripts/requirements.txt" "$ROOT/setup.cfg"
  env | grep -E '^(HVD_NGP_(TCNN_SRC|CUDA_ARCHS|EXTRAS|TORCH|SYSTEM_SITE|MPI4PY_SOURCE|HOROVOD_SDIST|ALLOW_NO_NCCL|WHEELHOUSE)|CC|CXX)=' | sort || true
} | sha256sum | cut -c1-16)"
if [[ "${HVD_NGP_FORCE:-0}" != "1" && -f "$STAMP" && "$(head -1 "$STAMP")" == "$STAMP_KEY" ]]; then
  if "$PY" - "$ROOT" "$HOROVOD_VERSION" "${HVD_NGP_TCNN_SRC:+tcnn}" >/dev/null 2>&1 <<'PY'
import sys
root, version, tcnn = sys.argv[1], sys.argv[2], sys.argv[3]
import torch, mpi4py, triton, horovod, horovod.torch, hvd_ngp  # noqa: F401,E401
assert horovod.__version__ == version and hvd_ngp.__file__.startswith(root)
from hvd_ngp.model.encoding import hashgrid_cpp
hashgrid_cpp.load_extension()
if tcnn:
    import tinycudann  # noqa: F401
PY
  then
    if [[ -x "$VENV/bin/hvd-ngp-train" && -x "$VENV/bin/hvd-ngp-doctor" && -x "$VENV/bin/horovodrun" ]]; then
      [[ "${HVD_NGP_DOCTOR:-0}" == "1" ]] && { "$VENV/bin/hvd-ngp-doctor" || die "hvd-ngp-doctor found a problem (above)"; }
      log "ready: $VENV ($(sed -n 2p "$STAMP"); already set up: checked in one process; HVD_NGP_FORCE=1 redoes every step, HVD_NGP_DOCTOR=1 runs hvd-ngp-doctor)"
      exit 0
    fi
  fi
  log "set up before, but a check failed: running every step"
fi

PIP=("$PY" -m pip install -q --disable-pip-version-check)
WHEELHOUSE="${HVD_NGP_WHEELHOUSE:-}"
if [[ -n "$WHEELHOUSE" ]]; then
  [[ -d "$WHEELHOUSE" ]] || die "HVD_NGP_WHEELHOUSE=$WHEELHOUSE: no such folder (fill it with scripts/wheelhouse.sh on a connected machine)"
  WHEELHOUSE="$(cd "$WHEELHOUSE" && pwd)"
  PIP+=(--no-index --find-links "$WHEELHOUSE")
  log "installing from the wheelhouse $WHEELHOUSE only (no package index)"
  if [[ -z "${HVD_NGP_HOROVOD_SDIST:-}" && -f "$WHEELHOUSE/horovod-$HOROVOD_VERSION.tar.gz" ]]; then
    HVD_NGP_HOROVOD_SDIST="$WHEELHOUSE/horovod-$HOROVOD_VERSION.tar.gz"
  fi
fi

have() { "$PY" -c "import $1" >/dev/null 2>&1; }

if ! have torch; then
  log "installing $TORCH_REQ"
  "${PIP[@]}" "$TORCH_REQ"
fi
# mpi4py's binary wheels load the system libmpi at run time (checked with Open MPI 4.1);
# HVD_NGP_MPI4PY_SOURCE=1 compiles it against $(mpicc) instead, for MPIs the wheels do not support.
if ! have mpi4py; then
  if [[ "${HVD_NGP_MPI4PY_SOURCE:-0}" == "1" ]]; then
    log "building mpi4py against $(command -v mpicc)"; "${PIP[@]}" --no-binary mpi4py "mpi4py>=3.1"
  else
    "${PIP[@]}" "mpi4py>=4.0"
  fi
fi
# Triton: the GPU kernels; on CPU-only machines its interpreter runs their parity tests.
have triton || "${PIP[@]}" "triton>=3.2,<4"
# the rest (scripts/requirements.txt: also what scripts/wheelhouse.sh downloads)
# An OpenCV the node already has (a site opencv-python, reused with HVD_NGP_SYSTEM_SITE=1) stays: a second
# distribution of cv2 beside it would shadow it half-way.
REQS="$ROOT/scripts/requirements.txt"
if "$PY" -c 'import cv2' >/dev/null 2>&1; then
  REQS="$(mktemp)"; grep -v '^opencv' "$ROOT/scripts/requirements.txt" >"$REQS"
  log "OpenCV $("$PY" -c 'import cv2; print(cv2.__version__)') is already installed: keeping it"
fi
# shellcheck disable=SC2086  # HVD_NGP_EXTRAS is a space-separated list: split on purpose
"${PIP[@]}" -r "$REQS" ${HVD_NGP_EXTRAS:-}

# ---------------------------------------------------------------- Horovod (patched 0.28.1, cached wheel)
read -r PYV TORCHV CUDAV < <("$PY" -c 'import sys, torch; print(f"{sys.version_info[0]}{sys.version_info[1]}", torch.__version__.replace("+", "_"), torch.version.cuda or "cpu")')
KEY="py${PYV}-torch${TORCHV}-cuda${CUDAV}"
if [[ "$CUDAV" != "cpu" ]]; then
  # GPU wheels are specific to the architectures they were compiled for too: sm90, sm80_90, ...
  ARCHS="${HVD_NGP_CUDA_ARCHS:-$("$PY" -c 'import torch; print(";".join(sorted({f"{a}{b}" for a, b in (torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count()))})))' 2>/dev/null || true)}"
  if [[ -z "$ARCHS" ]]; then
    ARCHS=90
    log "warning: torch sees no GPU here; building for sm_90 (set HVD_NGP_CUDA_ARCHS, e.g. \"80;90\")"
  fi
  KEY="$KEY-sm${ARCHS//;/_}"
  # the compiler: the system's when the default one is another (see the header)
  if [[ -z "${CC:-}${CXX:-}" && -x /usr/bin/g++ && -x /usr/bin/gcc ]]; then
    DEFAULT_CXX="$(readlink -f "$(command -v g++ || command -v c++ || echo /usr/bin/g++)")"
    if [[ "$DEFAULT_CXX" != /usr/bin/* ]]; then
      log "the default C++ compiler is $DEFAULT_CXX, not the system's: building the GPU extensions with CC=/usr/bin/gcc CXX=/usr/bin/g++ (a torch extension built with it may segfault inside its libstdc++; set CC/CXX to override)"
      export CC=/usr/bin/gcc CXX=/usr/bin/g++
    fi
  fi
  [[ -n "${CXX:-}" ]] && export CUDAHOSTCXX="${CUDAHOSTCXX:-$CXX}"
  export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
fi
WHEEL_DIR="$CACHE/wheels/$KEY"

horovod_ok() { "$PY" -c "import horovod, horovod.torch; assert horovod.__version__ == '$HOROVOD_VERSION'" >/dev/null 2>&1; }

if ! horovod_ok; then
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    BUILD="$(mktemp -d)"; trap 'rm -rf "$BUILD"' EXIT
    if [[ -n "${HVD_NGP_HOROVOD_SDIST:-}" ]]; then
      [[ -f "$HVD_NGP_HOROVOD_SDIST" ]] || die "HVD_NGP_HOROVOD_SDIST=$HVD_NGP_HOROVOD_SDIST: no such file"
      cp "$HVD_NGP_HOROVOD_SDIST" "$BUILD/"
    else
      [[ -z "$WHEELHOUSE" ]] || die "no horovod-$HOROVOD_VERSION.tar.gz in $WHEELHOUSE (scripts/wheelhouse.sh puts it there) and no HVD_NGP_HOROVOD_SDIST"
      log "downloading the horovod==$HOROVOD_VERSION sdist"
      "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$BUILD"
    fi
    tar -xzf "$BUILD"/horovod-*.tar.gz -C "$BUILD"
    SRC="$BUILD/horovod-$HOROVOD_VERSION"
    [[ -d "$SRC" ]] || die "the sdist did not unpack to horovod-$HOROVOD_VERSION"
    # Fixes from docs/HOROVOD_BUILD.md: C++17 for PyTorch >= 2.1, CUDA C++17 for CUDA 13.
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
    sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$SRC/horovod/common/ops/cuda/CMakeLists.txt"
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    export CXXFLAGS="${CXXFLAGS:-} -include cstdint -include string -include stdexcept -include memory -include limits"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    MAKEFLAGS="-j$(nproc)"
    export MAKEFLAGS
    if [[ "$CUDAV" != "cpu" ]]; then
      # NCCL: the system's (nccl.h + libnccl.so, e.g. libnccl-dev), else the nvidia-nccl-cu* wheel that a
      # pip-installed CUDA torch depends on (headers + libnccl.so.2; Horovod's CMake needs a libnccl.so:
      # linked into the build folder). At run time torch has already loaded that same libnccl.so.2.
      NCCL_LIB="$(dirname "$(ldconfig -p 2>/dev/null | awk '/libnccl\.so /{print $NF; exit}')" 2>/dev/null || true)"
      NCCL_WHEEL="$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
      if [[ -f "${HOROVOD_NCCL_HOME:-/usr}/include/nccl.h" && -n "$NCCL_LIB" && "$NCCL_LIB" != "." ]]; then
        export HOROVOD_NCCL_HOME="${HOROVOD_NCCL_HOME:-/usr}" HOROVOD_NCCL_LIB="${HOROVOD_NCCL_LIB:-$NCCL_LIB}"
        NCCL_FROM="the system ($HOROVOD_NCCL_LIB)"
      elif [[ -n "$NCCL_WHEEL" && -f "$NCCL_WHEEL/include/nccl.h" && -f "$NCCL_WHEEL/lib/libnccl.so.2" ]]; then
        mkdir -p "$BUILD/nccl/lib"
        ln -sf "$NCCL_WHEEL/lib/libnccl.so.2" "$BUILD/nccl/lib/libnccl.so"
        export HOROVOD_NCCL_INCLUDE="$NCCL_WHEEL/include" HOROVOD_NCCL_LIB="$BUILD/nccl/lib"
        NCCL_FROM="the nvidia-nccl wheel ($NCCL_WHEEL)"
      else
        NCCL_FROM=""
      fi
      if [[ -n "$NCCL_FROM" ]]; then
        export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED HOROVOD_WITH_PYTORCH=1
        export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-${ARCHS//;/,}}"
        log "CUDA $CUDAV with NCCL from $NCCL_FROM: building Horovod with NCCL for sm_${HOROVOD_BUILD_CUDA_CC_LIST}"
      elif [[ "${HVD_NGP_ALLOW_NO_NCCL:-0}" == "1" ]]; then
        log "warning: CUDA torch but no NCCL (no nccl.h + libnccl.so, no nvidia-nccl wheel): building Horovod without GPU operations (HVD_NGP_ALLOW_NO_NCCL=1)"
      else
        die "CUDA torch but no NCCL: install libnccl-dev (or pip install nvidia-nccl-cu${CUDAV%%.*} into the venv), or point HOROVOD_NCCL_HOME at it; HVD_NGP_ALLOW_NO_NCCL=1 builds Horovod without GPU operations (slow: gradients go through the CPU)"
      fi
    fi
    log "building Horovod $HOROVOD_VERSION for $KEY (several minutes; cached afterwards in $WHEEL_DIR)"
    mkdir -p "$WHEEL_DIR"
    "$PY" -m pip wheel -q --no-build-isolation --no-deps "$SRC" -w "$BUILD/dist" >"$BUILD/build.log" 2>&1 \
      || { tail -40 "$BUILD/build.log" >&2; die "Horovod build failed (full log above)"; }
    cp "$BUILD"/dist/horovod-*.whl "$WHEEL_DIR/"
  fi
  log "installing cached $(basename "$WHEEL_DIR"/horovod-*.whl) ($KEY)"
  "${PIP[@]}" --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
fi

# ---------------------------------------------------------------- this project (editable)
if ! "$PY" -c 'import hvd_ngp, sys; sys.exit(0 if hvd_ngp.__file__.startswith(sys.argv[1]) else 1)' "$ROOT" 2>/dev/null \
   || [[ ! -x "$VENV/bin/hvd-ngp-train" ]] || [[ ! -x "$VENV/bin/hvd-ngp-doctor" ]]; then
  log "installing hvd_ngp (editable)"
  "${PIP[@]}" --no-build-isolation --no-deps -e "$ROOT"
fi

# The C++ CPU hash-grid kernel compiles on first use; do it now rather than inside the first run.
"$PY" -c 'from hvd_ngp.model.encoding import hashgrid_cpp; hashgrid_cpp.load_extension()' \
  || log "warning: the C++ CPU kernel did not build; CPU runs fall back to --backend torch (slower)"

# ---------------------------------------------------------------- tiny-cuda-nn (GPU nodes, optional)
if [[ -n "${HVD_NGP_TCNN_SRC:-}" ]]; then
  [[ "$CUDAV" != "cpu" ]] || die "HVD_NGP_TCNN_SRC: tinycudann needs a CUDA torch (this one is $TORCHV)"
  if "$PY" -c 'import tinycudann' >/dev/null 2>&1 && ls "$WHEEL_DIR"/tinycudann-*.whl >/dev/null 2>&1; then
    log "tinycudann already installed ($KEY)"
  else
    if ! ls "$WHEEL_DIR"/tinycudann-*.whl >/dev/null 2>&1; then
      TBUILD="$(mktemp -d)"
      if [[ -d "$HVD_NGP_TCNN_SRC" ]]; then
        TSRC="$(cd "$HVD_NGP_TCNN_SRC" && pwd)"
      elif [[ -f "$HVD_NGP_TCNN_SRC" ]]; then
        tar -xzf "$HVD_NGP_TCNN_SRC" -C "$TBUILD"
        TSETUP="$(find "$TBUILD" -path '*/bindings/torch/setup.py' | head -1)"
        [[ -n "$TSETUP" ]] || die "HVD_NGP_TCNN_SRC=$HVD_NGP_TCNN_SRC: no bindings/torch/setup.py in the archive"
        TSRC="$(cd "$(dirname "$TSETUP")/../.." && pwd)"
      else
        die "HVD_NGP_TCNN_SRC=$HVD_NGP_TCNN_SRC: no such folder or file"
      fi
      [[ -f "$TSRC/bindings/torch/setup.py" ]] || die "HVD_NGP_TCNN_SRC: no bindings/torch/setup.py in $HVD_NGP_TCNN_SRC (a tiny-cuda-nn source tree?)"
      for sub in cutlass/include fmt/include; do
        [[ -d "$TSRC/dependencies/$sub" ]] || die "HVD_NGP_TCNN_SRC: dependencies/$sub is missing: the submodules are not there (git clone --recursive)"
      done
      log "building tinycudann from $TSRC for sm_$ARCHS with $("${CXX:-c++}" --version | head -1) (a few minutes; cached afterwards in $WHEEL_DIR)"
      (cd "$TSRC" && TCNN_CUDA_ARCHITECTURES="$ARCHS" "$PY" -m pip wheel -q --no-build-isolation --no-deps \
        bindings/torch -w "$TBUILD/dist") >"$TBUILD/build.log" 2>&1 \
        || { tail -40 "$TBUILD/build.log" >&2; die "tinycudann build failed (full log above: $TBUILD/build.log)"; }
      mkdir -p "$WHEEL_DIR"
      cp "$TBUILD"/dist/tinycudann-*.whl "$WHEEL_DIR/"
      rm -rf "$TBUILD"
    fi
    log "installing cached $(basename "$WHEEL_DIR"/tinycudann-*.whl) ($KEY)"
    "${PIP[@]}" --no-deps --force-reinstall "$WHEEL_DIR"/tinycudann-*.whl
  fi
  "$PY" -c 'import torch, tinycudann; print("[setup] tinycudann", getattr(tinycudann, "__version__", "?"), "imports")' >&2 \
    || die "tinycudann does not import (a compiler mismatch? see docs/troubleshooting.md, On GPU nodes)"
fi

"$VENV/bin/horovodrun" --check-build
if [[ "$CUDAV" != "cpu" || "${HVD_NGP_DOCTOR:-0}" == "1" ]]; then
  "$VENV/bin/hvd-ngp-doctor" || die "hvd-ngp-doctor found a problem (above)"
fi
printf '%s\n%s\n' "$STAMP_KEY" "horovod $HOROVOD_VERSION, $KEY" >"$STAMP"
log "ready: $VENV (horovod $HOROVOD_VERSION, $KEY)"
