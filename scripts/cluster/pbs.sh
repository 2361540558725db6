#!/usr/bin/env bash
# hvd_ngp under PBS Pro / OpenPBS: one rank per GPU on every allocated node, restartable.
#
#   cd /path/to/hvd_ngp && qsub -v TRAIN_ARGS="--scene data/fox --n_steps 20000" scripts/cluster/pbs.sh
#
# $PBS_NODEFILE (one line per MPI slot) becomes a "host slots=N" hostfile, which
# scripts/cluster/launch.sh hands to the launcher (python -m hvd_ngp.launch: mpirun, or
# horovodrun with LAUNCHER=horovodrun). "-r y" lets PBS rerun the job after a node failure; the
# periodic checkpoints and --resume auto make the rerun continue where it stopped.
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
exec "$repo/scripts/cluster/launch.sh" "$hostfile" "$run_dir" "${train_args[@]}"
