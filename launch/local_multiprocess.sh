#!/usr/bin/env bash
# Run one training job as N processes on this machine (JAX multi-controller over gloo on CPU).
#
#   launch/local_multiprocess.sh N [--dry-run] ARGS...
#     N        number of processes
#     ARGS     passed to every `python -m mlm_jax.train` (e.g. --config=configs/demo.py --workdir=/tmp/run)
#   Environment: DEVICES_PER_PROCESS (default 4) CPU devices per process; PORT (default 12355) of the
#   coordinator on localhost; PYTHON (default python3).
#
# Process 0 logs to the console; process i>0 to LOG_DIR/mlm_jax_proc<i>.log (LOG_DIR default /tmp). If any process fails, the others stop (the runtime's heartbeat), and this
# script exits with the first non-zero status.
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 N [--dry-run] ARGS..." >&2
  exit 2
fi
n=$1
shift
dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then
  dry_run=1
  shift
fi
devices=${DEVICES_PER_PROCESS:-4}
port=${PORT:-12355}
python=${PYTHON:-python3}
log_dir=${LOG_DIR:-/tmp}

args=$(printf ' %q' "$@")   # quoted, so config tuples like "('a=b',)" survive bash -c
commands=()
for ((i = 0; i < n; i++)); do
  commands+=("XLA_FLAGS=--xla_force_host_platform_device_count=${devices} JAX_PLATFORMS=cpu ${python} -m mlm_jax.train --coordinator_address=localhost:${port} --num_processes=${n} --process_id=${i}${args}")
done

if ((dry_run)); then
  printf '%s\n' "${commands[@]}"
  exit 0
fi

pids=()
for ((i = 0; i < n; i++)); do
  if ((i == 0)); then
    bash -c "${commands[$i]}" &
  else
    bash -c "${commands[$i]}" >"${log_dir}/mlm_jax_proc${i}.log" 2>&1 &
  fi
  pids+=($!)
done

status=0
for pid in "${pids[@]}"; do
  rc=0
  wait "$pid" || rc=$?
  if ((rc != 0 && status == 0)); then status=$rc; fi
done
exit "$status"
