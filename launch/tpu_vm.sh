#!/usr/bin/env bash
# Train on a Cloud TPU VM slice: create (or reuse) it, copy this checkout to every worker, install,
# and run the same training command on all workers at once.
#
#   launch/tpu_vm.sh [--dry-run] --name=NAME --zone=ZONE --accelerator=v5p-32 [--project=PROJECT] \
#       [--version=RUNTIME] [--spot] -- --config=configs/xlmr_base.py --workdir=gs://BUCKET/run1 [--config.x=y ...]
#
# Everything after `--` goes to `python -m mlm_jax.train` on every worker. With --tool=PATH --hosts=N
# (e.g. --tool=tools/prepare_data.py), worker i runs `python3 PATH --task_index=i --num_tasks=N ARGS`
# instead (no --workdir needed). The workdir must be on
# GCS (gs://...): every host writes its part of each checkpoint there, and a preempted or recreated
# slice resumes by running the same command again. JAX finds the other workers by itself on TPU VMs.
# --dry-run prints the gcloud commands instead of running them.
set -euo pipefail

dry_run=0 name="" zone="" accelerator="" project="" version="tpu-ubuntu2204-base" spot="" tool="" hosts=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --name=*) name=${1#*=} ;;
    --zone=*) zone=${1#*=} ;;
    --accelerator=*) accelerator=${1#*=} ;;
    --project=*) project=${1#*=} ;;
    --version=*) version=${1#*=} ;;
    --spot) spot="--spot" ;;
    --tool=*) tool=${1#*=} ;;
    --hosts=*) hosts=${1#*=} ;;
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
if [[ -n "$tool" && "$hosts" -lt 1 ]]; then
  echo "error: --tool needs --hosts=N (the number of workers of the slice)" >&2
  exit 2
fi
if [[ -z "$tool" && "$workdir" != gs://* ]]; then
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
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

if ((dry_run)) || ! gcloud compute tpus tpu-vm describe "$name" "${gflags[@]}" >/dev/null 2>&1; then
  # shellcheck disable=SC2086  # $spot is empty or one flag
  run gcloud compute tpus tpu-vm create "$name" "${gflags[@]}" --accelerator-type="$accelerator" \
    --version="$version" $spot
fi
run git -C "$here" archive --format=tar.gz -o "$tarball" HEAD
run gcloud compute tpus tpu-vm scp "$tarball" "$name":~/mlm_jax_src.tar.gz --worker=all "${gflags[@]}"
run gcloud compute tpus tpu-vm ssh "$name" --worker=all "${gflags[@]}" \
  --command="rm -rf ~/mlm_jax && mkdir -p ~/mlm_jax && tar -xzf ~/mlm_jax_src.tar.gz -C ~/mlm_jax && cd ~/mlm_jax && python3 -m pip install -q -e '.[tpu]'"
if [[ -n "$tool" ]]; then
  pids=()
  for ((i = 0; i < hosts; i++)); do
    run gcloud compute tpus tpu-vm ssh "$name" --worker="$i" "${gflags[@]}" \
      --command="cd ~/mlm_jax && python3 $(printf '%q' "$tool") --task_index=$i --num_tasks=${hosts}${train_args}" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  exit 0
fi
run gcloud compute tpus tpu-vm ssh "$name" --worker=all "${gflags[@]}" \
  --command="cd ~/mlm_jax && python3 -m mlm_jax.train${train_args}"
