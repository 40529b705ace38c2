#!/usr/bin/env bash
# Stage 2 of the regime study: `eae pretrain` for every cell, all side by side (on one GPU each
# worker gets an equal share of it). A cell whose model exists is skipped; a cell stopped by
# BUDGET_S (train.time_budget_s), STOP_AT (train.deadline) or killed continues from its last
# checkpoint when this runs again (same run name). Exits 0 when every cell has its model, 10
# when some are paused.
#   BUDGET_S=500 experiments/regime/pretrain.sh
#   STOP_AT=$(( $(date +%s) + 500 )) experiments/regime/pretrain.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. experiments/regime/settings.sh
mkdir -p "$STUDY/logs" "$MODELS"
for w in $WORLDS; do  # a cell needs its world's shards (and their entity count), which data.sh builds
  has_data "$w" ||
    { echo "world $w has no data ($(data_dir "$w")/manifest.json is missing): run experiments/regime/data.sh first" >&2; exit 2; }
done
pids=()
while read -r w z v s; do
  cell=$(cell_name "$w" "$z" "$v" "$s")
  [ -f "$MODELS/$cell/config.json" ] && continue
  n=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['counts']['entities'])" "$(data_dir "$w")/manifest.json")
  # shellcheck disable=SC2046
  MLFLOW_TRACKING_URI=$(store "$cell") eae pretrain --preset "$z" --data "$(data_dir "$w")" --max-steps "$STEPS" \
    --name "$cell" --out "$MODELS/$cell" --num-workers 1 \
    --set model.num_entities="$n" --set model.max_length=128 --set train.batch_size="$BATCH" --set train.lr="$LR" --set train.warmup_fraction="$WARMUP" \
    --set train.memory_lr_scale="$MEMORY_LR_SCALE" --set model.memory_layer_norm="$MEMORY_LAYER_NORM" --set model.weight_memory_el="$MEMORY_EL_WEIGHT" --set model.memory_query_detached="$MEMORY_QUERY_DETACHED" --set train.shuffle_rows="$SHUFFLE_ROWS" --set train.pad_multiple="$PAD_MULTIPLE" --set train.seed="$s" --set train.log_every="$LOG_EVERY" --set train.checkpoint_every=1000 --set train.eval_batches=4 \
    --set train.storage_path="$STUDY/ray" --set train.register_as=null --set train.experiment=regime-pretrain \
    ${BUDGET_S:+--set train.time_budget_s=$BUDGET_S} ${STOP_AT:+--set train.deadline=$STOP_AT} $(device_set) $(variant_set "$v") $(size_set "$z") \
    >> "$STUDY/logs/pretrain-$cell.log" 2>&1 &
  pids+=($!)
done < <(cells)
say "pretraining ${#pids[@]} cell(s) side by side${BUDGET_S:+ (time budget $BUDGET_S s each)}${STOP_AT:+ (pausing at $(date -u -d "@$STOP_AT" +%T))}; logs in $STUDY/logs"
for p in "${pids[@]}"; do wait "$p"; done
paused=0
while read -r w z v s; do
  cell=$(cell_name "$w" "$z" "$v" "$s")
  line=$(grep -hE "^(finished at step|paused at step|eae: error)" "$STUDY/logs/pretrain-$cell.log" 2>/dev/null | tail -1)
  last=$(grep -hoE "step [0-9]+: loss.*" "$STUDY/logs/pretrain-$cell.log" 2>/dev/null | tail -1 | cut -c1-120)
  echo "$cell: ${line:-no result (see $STUDY/logs/pretrain-$cell.log)} | $last"
  [ -f "$MODELS/$cell/config.json" ] || paused=1
done < <(cells)
[ "$paused" = 0 ] || exit 10
