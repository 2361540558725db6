#!/usr/bin/env bash
# hvd_ngp under PBS Pro / OpenPBS: one rank per GPU on every allocated node, restartable.
#
#   cd /path/to/hvd_ngp && qsub -v TRAIN_ARGS="--scene data/fox --n_steps 20000" scripts/cluster/pbs.sh
#
# $PBS_NODEFILE (one line per MPI slot) becomes a "host slots=N" hostfile, which
# scripts/cluster/launch.sh hands to the launcher (python -m hvd_ngp.launch: mpirun, or
# horovodrun with LAUNCHER=horovodrun). "-r y" lets PBS rerun the job after a node failure; the
# periodic checkpoints and --resume auto make the rerun continue where it stopped.
#
# Walltime: PBS sends SIGTERM to the job's processes and SIGKILL kill_delay (qmgr; often 10-30 s)
# later; PBS has no early warning. This shell passes the SIGTERM to hvd-ngp-launch, the ranks stop
# after the same step with a checkpoint, and the launcher exits 75. With HVD_NGP_REQUEUE=1 the script then submits
# itself again (qsub, same RUN_DIR and TRAIN_ARGS; --resume auto continues), or reruns the job with
# qrerun when HVD_NGP_PBS_REQUEUE=qrerun (needs operator rights at most sites).
#PBS -N hvd_ngp
#PBS -l select=2:ncpus=64:ngpus=8:mpiprocs=8
#PBS -l walltime=04:00:00
#PBS -j oe
#PBS -r y
set -euo pipefail

repo=${HVD_NGP_REPO:-${PBS_O_WORKDIR:?submit from the repository root or set HVD_NGP_REPO}}
job=${PBS_JOBID:?not inside a PBS job}
run_dir=${RUN_DIR:-$repo/runs/${PBS_JOBNAME:-hvd_ngp}-${job%%.*}}
mkdir -p "$run_dir"
hostfile=$run_dir/hostfile
# count each node's lines, keeping PBS's order (its first node runs rank 0)
awk '!($1 in n) { order[++k] = $1 } { n[$1]++ } END { for (i = 1; i <= k; i++) print order[i] " slots=" n[order[i]] }' \
  "${PBS_NODEFILE:?not inside a PBS job}" >"$hostfile"
# qsub passes no arguments to the script: trainer flags come in TRAIN_ARGS (split on spaces)
read -r -a train_args <<<"${TRAIN_ARGS:-}"
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-20}
# shellcheck source=scripts/cluster/stop_forwarding.sh source-path=SCRIPTDIR/../..
source "$repo/scripts/cluster/stop_forwarding.sh"
run_forwarding "$repo/scripts/cluster/launch.sh" "$hostfile" "$run_dir" "${train_args[@]}"
if wants_requeue; then
  if [[ ${HVD_NGP_PBS_REQUEUE:-qsub} == qrerun ]]; then
    echo "[job] training stopped with steps left: qrerun $job" >&2
    qrerun "$job"
  else
    echo "[job] training stopped with steps left: submitting it again (RUN_DIR=$run_dir)" >&2
    qsub -v "HVD_NGP_REPO=$repo,RUN_DIR=$run_dir,HVD_NGP_REQUEUE=1,TRAIN_ARGS=${TRAIN_ARGS:-}" "$repo/scripts/cluster/pbs.sh"
  fi
fi
exit "$launch_status"
