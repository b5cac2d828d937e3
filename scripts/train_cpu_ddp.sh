#!/usr/bin/env bash
# Run fairseq-train with N processes of fairseq's own distributed data parallel on CPU.
#
#   scripts/train_cpu_ddp.sh N DATA --user-dir fairseq_headprune --arch gated_transformer ...
#
# fairseq's CPU path needs one process per rank with gloo and legacy_ddp (its default
# pytorch_ddp passes CUDA device ids; torchrun reaches a CUDA-only code path). This script
# adds those flags; MASTER_PORT picks the rendezvous port (default: a free one). If a rank
# fails, the others are stopped and the script exits non-zero.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 NUM_PROCS fairseq-train-args..." >&2; exit 2; }
n="$1"; shift
FAIRSEQ_TRAIN="${FAIRSEQ_TRAIN:-fairseq-train}"
port="${MASTER_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for ((rank = 0; rank < n; rank++)); do
  "$FAIRSEQ_TRAIN" "$@" --cpu --distributed-backend gloo --distributed-world-size "$n" \
    --distributed-init-method "tcp://127.0.0.1:$port" --distributed-no-spawn \
    --distributed-rank "$rank" --ddp-backend legacy_ddp &
  pids+=($!)
done
for _ in "${pids[@]}"; do
  wait -n || exit $?
done
trap - EXIT
