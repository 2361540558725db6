#!/usr/bin/env bash
# Launch hvd_ngp on the hosts of a hostfile ("host slots=N" lines), one rank per slot, as a
# restartable run: a checkpoint every CKPT_MINUTES minutes and --resume auto, so a requeued or
# resubmitted job continues from the newest valid checkpoint in RUN_DIR/checkpoints.
# Used by slurm.sbatch and pbs.sh; usable by hand on any set of ssh-reachable nodes.
#
#   scripts/cluster/launch.sh HOSTFILE RUN_DIR [trainer flags...]
#
# Environment: LAUNCHER=mpirun (default) | horovodrun; HVD_NGP_VENV (default <repo>/.venv);
# CKPT_MINUTES (default 20); HVD_NGP_DRY_RUN=1 prints the command instead of running it.
# NCCL_*, HOROVOD_* and HVD_NGP_* variables are forwarded to every rank.
# (When `python -m hvd_ngp.launch` is available, it replaces this file: it validates the
# hostfile, picks hierarchical allreduce and the NCCL presets for the fabric.)
set -euo pipefail

if (($# < 2)); then
  echo "usage: $0 HOSTFILE RUN_DIR [trainer flags...]" >&2
  exit 2
fi
hostfile=$1 run_dir=$2
shift 2
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${HVD_NGP_VENV:-$repo/.venv}
if [[ ! -x $venv/bin/python ]]; then
  echo "launch.sh: no Python environment at $venv (run scripts/setup.sh, or set HVD_NGP_VENV)" >&2
  exit 2
fi
# total slots: the sum of slots=N (1 when a line has none); comments and blank lines ignored
np=$(awk '!/^[[:space:]]*(#|$)/ { n = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) n = substr($i, 7); total += n }
          END { print total + 0 }' "$hostfile")
if ((np < 1)); then
  echo "launch.sh: $hostfile lists no hosts" >&2
  exit 2
fi

train=("$venv/bin/python" -m hvd_ngp.train --out_dir "$run_dir" --ckpt_every_minutes "${CKPT_MINUTES:-20}"
       --resume auto "$@")
case ${LAUNCHER:-mpirun} in
  mpirun)
    forward=()
    while IFS= read -r name; do forward+=(-x "$name"); done < <(compgen -e | grep -E '^(NCCL_|HOROVOD_|HVD_NGP_)' || true)
    if [[ -n ${LD_LIBRARY_PATH:-} ]]; then forward+=(-x LD_LIBRARY_PATH); fi
    cmd=(mpirun -np "$np" --hostfile "$hostfile" --map-by slot --bind-to none -x PATH "${forward[@]}" "${train[@]}") ;;
  horovodrun)
    cmd=("$venv/bin/horovodrun" -np "$np" -hostfile "$hostfile" "${train[@]}") ;;
  *)
    echo "launch.sh: LAUNCHER must be mpirun or horovodrun, got '${LAUNCHER}'" >&2
    exit 2 ;;
esac
echo "launch.sh: $np rank(s) on $(grep -cvE '^[[:space:]]*(#|$)' "$hostfile") host(s): ${cmd[*]}" >&2
if [[ ${HVD_NGP_DRY_RUN:-0} == 1 ]]; then
  exit 0
fi
exec "${cmd[@]}"
