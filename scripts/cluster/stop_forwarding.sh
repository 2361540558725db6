#!/usr/bin/env bash
# Sourced by slurm.sbatch and pbs.sh: run the launcher in the background, pass scheduler signals on,
# and tell whether the job should be requeued.
#
#   run_forwarding CMD...   runs CMD (scripts/cluster/launch.sh: hvd-ngp-launch, which turns a signal
#                           into a checkpointed stop of every rank), forwards SIGUSR1/SIGTERM/SIGINT to
#                           it, waits, and sets $launch_status (75: stopped with a checkpoint, steps left)
#
# Scheduler signals reach the batch shell first (SLURM --signal=B:USR1@90, PBS SIGTERM at walltime);
# bash runs a trap only between commands, so the launcher runs in the background and `wait` is
# interrupted by the trap, which passes the signal on and waits again.
EXIT_PREEMPTED=75

launch_status=0
run_forwarding() {
  "$@" &
  local pid=$!
  # shellcheck disable=SC2064  # $pid is expanded now, on purpose
  for sig in USR1 TERM INT; do
    trap "echo \"[job] got SIG$sig: asking the ranks to stop with a checkpoint\" >&2; kill -$sig $pid 2>/dev/null || true" "$sig"
  done
  while kill -0 "$pid" 2>/dev/null; do
    wait "$pid" 2>/dev/null || true # returns early when a trapped signal arrives
  done
  # bash keeps the status of a finished background job for a later `wait`
  launch_status=0
  wait "$pid" || launch_status=$?
  trap - USR1 TERM INT
}

# wants_requeue: the trainer stopped with a checkpoint and steps left, and the user asked for requeues
wants_requeue() {
  [[ $launch_status == "$EXIT_PREEMPTED" && ${HVD_NGP_REQUEUE:-0} == 1 ]]
}
