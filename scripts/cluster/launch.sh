#!/usr/bin/env bash
# Launch hvd_ngp on the hosts of a hostfile ("host slots=N" lines), one rank per slot, as a
# restartable run: a checkpoint every CKPT_MINUTES minutes and --resume auto, so a requeued or
# resubmitted job continues from the newest valid checkpoint in RUN_DIR/checkpoints.
# Used by slurm.sbatch and pbs.sh; usable by hand on any set of ssh-reachable nodes.
#
#   scripts/cluster/launch.sh HOSTFILE RUN_DIR [trainer flags...]
#
# The command itself comes from the project's launcher (python -m hvd_ngp.launch): it checks the
# hostfile (errors name the line), picks the controller and hierarchical allreduce for the node
# count, forwards NCCL_*/HOROVOD_*/UCX_* variables and prints its plan before it starts.
# Environment: LAUNCHER=mpirun (default) | horovodrun; HVD_NGP_VENV (default <repo>/.venv);
# CKPT_MINUTES (default 20); HVD_NGP_LAUNCH_ARGS (more launcher flags, e.g. "--fabric ib --iface ib0");
# HVD_NGP_DRY_RUN=1 prints the plan instead of running it.
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
launcher=${LAUNCHER:-mpirun}
if [[ $launcher != mpirun && $launcher != horovodrun ]]; then
  echo "launch.sh: LAUNCHER must be mpirun or horovodrun, got '$launcher'" >&2
  exit 2
fi
launch=("$venv/bin/python" -m hvd_ngp.launch --hostfile "$hostfile" --launcher "$launcher" --python "$venv/bin/python")
# shellcheck disable=SC2206  # word splitting of the extra launcher flags is intended
launch+=(${HVD_NGP_LAUNCH_ARGS:-})
if [[ ${HVD_NGP_DRY_RUN:-0} == 1 ]]; then
  launch+=(--dry-run)
fi
cd "$repo"
exec "${launch[@]}" -- --out_dir "$run_dir" --ckpt_every_minutes "${CKPT_MINUTES:-20}" --resume auto "$@"
