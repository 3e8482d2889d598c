#!/usr/bin/env bash
# Train on a Cloud TPU VM slice: create (or reuse) it, copy this checkout to every worker, install,
# and run the same training command on all workers at once.
#
#   launch/tpu_vm.sh [--dry-run] --name=NAME --zone=ZONE --accelerator=v5p-32 [--project=PROJECT] \
#       [--version=RUNTIME] [--spot] [--num_slices=N] -- --config=configs/xlmr_base.py --workdir=gs://BUCKET/run1 [--config.x=y ...]
#
# --num_slices=N (multi-slice, N slices joined by the data-center network): a queued resource NAME
# with N nodes NAME-0 .. NAME-(N-1), each a slice of --accelerator; the command runs on every worker
# of every node. The TPU runtime sets the MEGASCALE_* variables (coordinator, slice count and id) on
# each worker; nothing else is needed. The mesh's dcn_* fields say which axes span slices (default:
# data; e.g. --config.mesh.data=N --config.mesh.fsdp=-1 for the fsdp configs). Check the fit and the
# DCN traffic first: tools/aot_compile.py --topology=v5p:4x4x4 --num_slices=N.
#
# Everything after `--` goes to `python -m mlm_jax.train` on every worker. The workdir must be on
# GCS (gs://...): every host writes its part of each checkpoint there, and a preempted or recreated
# slice resumes by running the same command again. JAX finds the other workers by itself on TPU VMs.
# --dry-run prints the gcloud commands instead of running them.
set -euo pipefail

dry_run=0 name="" zone="" accelerator="" project="" version="tpu-ubuntu2204-base" spot="" slices=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --name=*) name=${1#*=} ;;
    --zone=*) zone=${1#*=} ;;
    --accelerator=*) accelerator=${1#*=} ;;
    --project=*) project=${1#*=} ;;
    --version=*) version=${1#*=} ;;
    --spot) spot="--spot" ;;
    --num_slices=*) slices=${1#*=} ;;
    --) shift; break ;;
    *) echo "unknown option $1 (training arguments go after --)" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z "$name" || -z "$zone" || -z "$accelerator" ]]; then
  echo "usage: $0 [--dry-run] --name=NAME --zone=ZONE --accelerator=TYPE [--project=P] -- TRAIN_ARGS..." >&2
  exit 2
fi
workdir=""
for a in "$@"; do
  if [[ "$a" == --workdir=* ]]; then workdir=${a#--workdir=}; fi
done
if ! [[ "$slices" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: --num_slices must be a positive integer (got '${slices}')" >&2
  exit 2
fi
if [[ "$workdir" != gs://* ]]; then
  echo "error: --workdir must be a gs:// path shared by all workers (got '${workdir}')" >&2
  exit 2
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gflags=(--zone="$zone")
if [[ -n "$project" ]]; then gflags+=(--project="$project"); fi
train_args=$(printf ' %q' "$@")
tarball=/tmp/mlm_jax_src.tar.gz

run() {
  if ((dry_run)); then
    printf '%s\n' "$(printf '%q ' "$@")"   # one write per command: parallel subshells do not interleave
  else
    "$@"
  fi
}

if ((slices > 1)); then
  nodes=()
  for ((i = 0; i < slices; i++)); do nodes+=("${name}-${i}"); done
  if ((dry_run)) || ! gcloud compute tpus queued-resources describe "$name" "${gflags[@]}" >/dev/null 2>&1; then
    # shellcheck disable=SC2086  # $spot is empty or one flag
    run gcloud compute tpus queued-resources create "$name" "${gflags[@]}" --accelerator-type="$accelerator" \
      --runtime-version="$version" --node-count="$slices" --node-prefix="$name" $spot
  fi
  if ((!dry_run)); then
    until [[ "$(gcloud compute tpus queued-resources describe "$name" "${gflags[@]}" --format='value(state.state)')" == ACTIVE ]]; do
      echo "waiting for the $slices slices of $name to be ACTIVE ..." >&2
      sleep 30
    done
  fi
  run git -C "$here" archive --format=tar.gz -o "$tarball" HEAD
  pids=()
  for node in "${nodes[@]}"; do
    (
      run gcloud compute tpus tpu-vm scp "$tarball" "$node":~/mlm_jax_src.tar.gz --worker=all "${gflags[@]}"
      run gcloud compute tpus tpu-vm ssh "$node" --worker=all "${gflags[@]}" \
        --command="rm -rf ~/mlm_jax && mkdir -p ~/mlm_jax && tar -xzf ~/mlm_jax_src.tar.gz -C ~/mlm_jax && cd ~/mlm_jax && python3 -m pip install -q -e '.[tpu]'"
    ) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  pids=()
  for node in "${nodes[@]}"; do   # every worker of every slice at once: the job starts when all have joined
    run gcloud compute tpus tpu-vm ssh "$node" --worker=all "${gflags[@]}" \
      --command="cd ~/mlm_jax && MLM_JAX_DISTRIBUTED=1 python3 -m mlm_jax.train${train_args}" &
    pids+=($!)
  done
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  exit "$status"
fi

if ((dry_run)) || ! gcloud compute tpus tpu-vm describe "$name" "${gflags[@]}" >/dev/null 2>&1; then
  # shellcheck disable=SC2086  # $spot is empty or one flag
  run gcloud compute tpus tpu-vm create "$name" "${gflags[@]}" --accelerator-type="$accelerator" \
    --version="$version" $spot
fi
run git -C "$here" archive --format=tar.gz -o "$tarball" HEAD
run gcloud compute tpus tpu-vm scp "$tarball" "$name":~/mlm_jax_src.tar.gz --worker=all "${gflags[@]}"
run gcloud compute tpus tpu-vm ssh "$name" --worker=all "${gflags[@]}" \
  --command="rm -rf ~/mlm_jax && mkdir -p ~/mlm_jax && tar -xzf ~/mlm_jax_src.tar.gz -C ~/mlm_jax && cd ~/mlm_jax && python3 -m pip install -q -e '.[tpu]'"
run gcloud compute tpus tpu-vm ssh "$name" --worker=all "${gflags[@]}" \
  --command="cd ~/mlm_jax && python3 -m mlm_jax.train${train_args}"
