#!/usr/bin/env bash
# The regime study on a laptop (2 CPU cores, ~1¼ hours at the defaults): EaE and No-EaE on a
# 1,000-entity synthetic world whose facts are stated 4 times, with the `tiny` transformer and
# the entity table and memory at 10x the lr (train.memory_lr_scale), 3 seeds; then closed-book
# QA, fact recall and masked entities for each, one MLflow store and its tables
# (docs/results.md, round 63, has what it gave).
#   experiments/regime/cpu.sh                     # -> runs/regime-cpu.mlruns.tar.xz
#   MEMORY_LR_SCALE=1 STUDY=runs/regime-cpu-1x experiments/regime/cpu.sh   # any setting of settings.sh
# With FROM_STUDY, another QA recipe for that study's models (a store of QA runs only), then
# each model at its recipe picked on dev QA against the other:
#   FROM_STUDY=runs/regime-cpu STUDY=runs/regime-cpu-qa1e-3 QA_BATCH=32 QA_LR=1e-3 experiments/regime/cpu.sh
# The stages are the GPU study's, a seed's cells at a time rather than every cell at once (two
# cores shared six ways gain nothing), on one local Ray head this script starts (RAY_ADDRESS
# set: that cluster instead): an `eae` command without one starts a Ray instance of its own,
# ~30 s each, and four starting at once on two cores time out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export STUDY=${STUDY:-runs/regime-cpu} WORLDS=${WORLDS:-1000r4} SIZES=${SIZES:-tiny} \
  VARIANTS=${VARIANTS:-"eae no_eae"} STEPS=${STEPS:-8000} BATCH=${BATCH:-64} LR=${LR:-1e-3} \
  WARMUP=${WARMUP:-0.05} MEMORY_LR_SCALE=${MEMORY_LR_SCALE:-10} PAD_MULTIPLE=${PAD_MULTIPLE:-16} \
  LOG_EVERY=${LOG_EVERY:-200} QA_STEPS=${QA_STEPS:-300} QA_BATCH=${QA_BATCH:-128} QA_LR=${QA_LR:-1e-4} \
  PROBES=${PROBES:-200} TOPK=${TOPK-""} DEVICE=cpu
seeds=${SEEDS:-"0 1 2"}
store=$(realpath -m "$STUDY").mlruns.tar.xz
from=$(realpath -m "${FROM_STUDY:-$STUDY}")
if [ "$from" = "$(realpath -m "$STUDY")" ]; then
  stages="data pretrain finetune eval"
else
  [ -f "$from.mlruns.tar.xz" ] || { echo "no store $from.mlruns.tar.xz: run $0 with STUDY=$FROM_STUDY first" >&2; exit 2; }
  stages=finetune
fi
mkdir -p "$STUDY/logs"
if [ -z "${RAY_ADDRESS:-}" ]; then
  port=$(scripts/free-port) dashboard=$(scripts/free-port)
  export RAY_AUTH_MODE=token RAY_AUTH_TOKEN
  RAY_AUTH_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
  scripts/ray-head "$port" "$dashboard" > "$STUDY/logs/ray-head.log" 2>&1 &
  head_pid=$!
  trap 'kill "$head_pid" 2>/dev/null; wait "$head_pid" 2>/dev/null || true' EXIT
  scripts/wait-for-job-api "http://127.0.0.1:$dashboard" 120 "$head_pid" ||
    { echo "the Ray head did not start ($STUDY/logs/ray-head.log:)" >&2; tail -20 "$STUDY/logs/ray-head.log" >&2; exit 1; }
  export RAY_ADDRESS=127.0.0.1:$port
fi
for stage in $stages; do
  if [ "$stage" = data ]; then experiments/regime/data.sh; continue; fi
  for s in $seeds; do SEEDS=$s "experiments/regime/$stage.sh"; done
done
experiments/regime/collect.sh "$store"
if [ "$stages" = finetune ]; then
  "${PYTHON:-.venv/bin/python}" experiments/results_tables.py --best-recipe "$from.mlruns.tar.xz" "$store"
else
  "${PYTHON:-.venv/bin/python}" experiments/results_tables.py "$store"
fi
