#!/usr/bin/env bash
# Fill a wheelhouse on a connected machine, for scripts/setup.sh on nodes without network:
#
#   bash scripts/wheelhouse.sh DIR [--python 3.12] [--platform manylinux_2_28_x86_64] [--torch "torch==2.11.0"]
#                                  [--torch-index https://download.pytorch.org/whl/cu130] [--nccl cu13] [--no-torch]
#   # copy DIR (and a tiny-cuda-nn source tarball, for tinycudann) to the cluster, then on a node:
#   HVD_NGP_WHEELHOUSE=DIR bash scripts/setup.sh
#
# Downloads binary wheels of torch, mpi4py, triton and scripts/requirements.txt for the target Python
# and platform (default: this machine's), and the Horovod sdist (setup.sh builds Horovod on the node,
# against its MPI, CUDA and NCCL). --no-torch: the nodes reuse a site CUDA torch (HVD_NGP_SYSTEM_SITE=1).
# --nccl cu12|cu13: add the nvidia-nccl-cu* wheel (headers + library) for nodes without a system NCCL.
# HVD_NGP_DRY_RUN=1 prints the pip commands instead of running them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOROVOD_VERSION=0.28.1
usage() { sed -n '2,16p' "$0" >&2; exit 2; }
(($#)) || usage
DIR=$1
shift
PYTHON_VERSION="" PLATFORM="" TORCH_REQ="${HVD_NGP_TORCH:-torch==2.13.0}" TORCH_INDEX="" NCCL="" WITH_TORCH=1
while (($#)); do
  case $1 in
    --python) PYTHON_VERSION=$2; shift 2 ;;
    --platform) PLATFORM=$2; shift 2 ;;
    --torch) TORCH_REQ=$2; shift 2 ;;
    --torch-index) TORCH_INDEX=$2; shift 2 ;;
    --nccl) NCCL=$2; shift 2 ;;
    --no-torch) WITH_TORCH=0; shift ;;
    -h | --help) usage ;;
    *) echo "wheelhouse.sh: unknown option $1" >&2; usage ;;
  esac
done
PY="${HVD_NGP_PYTHON:-python3}"
run() {
  if [[ ${HVD_NGP_DRY_RUN:-0} == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}
mkdir -p "$DIR"
target=()
[[ -n $PYTHON_VERSION ]] && target+=(--python-version "$PYTHON_VERSION")
if [[ -n $PLATFORM ]]; then
  target+=(--platform "$PLATFORM")
  # pip takes --platform literally: manylinux_2_28 also runs every older manylinux wheel (2_27 ... 2_5,
  # manylinux2014/2010/1), so list those tags too (mpi4py, for one, ships manylinux1 wheels only)
  if [[ $PLATFORM =~ ^manylinux_2_([0-9]+)_(.+)$ ]]; then
    for ((minor = BASH_REMATCH[1] - 1; minor >= 5; minor--)); do target+=(--platform "manylinux_2_${minor}_${BASH_REMATCH[2]}"); done
    target+=(--platform "manylinux2014_${BASH_REMATCH[2]}" --platform "manylinux2010_${BASH_REMATCH[2]}" --platform "manylinux1_${BASH_REMATCH[2]}")
  fi
fi
# pip download for another Python or platform accepts binary wheels only
((${#target[@]})) && target+=(--only-binary :all:)
dl=("$PY" -m pip download -q --disable-pip-version-check -d "$DIR" "${target[@]}")
reqs=("mpi4py>=4.0" "triton>=3.2,<4" -r "$ROOT/scripts/requirements.txt")
[[ -n $NCCL ]] && reqs+=("nvidia-nccl-$NCCL")
if ((WITH_TORCH)); then
  torch_dl=("${dl[@]}")
  [[ -n $TORCH_INDEX ]] && torch_dl+=(--extra-index-url "$TORCH_INDEX")
  echo "[wheelhouse] $TORCH_REQ and its dependencies" >&2
  run "${torch_dl[@]}" "$TORCH_REQ"
fi
echo "[wheelhouse] mpi4py, triton, scripts/requirements.txt${NCCL:+, nvidia-nccl-$NCCL}" >&2
run "${dl[@]}" "${reqs[@]}"
echo "[wheelhouse] the horovod==$HOROVOD_VERSION sdist (setup.sh builds it on the node)" >&2
run "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$DIR"
echo "[wheelhouse] $DIR: $(find "$DIR" -maxdepth 1 -type f | wc -l) file(s), $(du -sh "$DIR" | cut -f1); on the node: HVD_NGP_WHEELHOUSE=$DIR bash scripts/setup.sh" >&2
