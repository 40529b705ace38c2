#!/usr/bin/env bash
# Stage 4 of the regime study, for every pretrained cell, side by side:
#   eae eval lama    fact recall: a cloze probe per fact of the world ("[X] was born in
#                    [MASK] ."), split into facts pretraining read (their article is in the
#                    training split: eval.stated_in) and the rest, beside the prior-only baseline;
#                    for the real-text world `vital`: $REAL_PROBES (settings.sh)
#   (EaE)            the same probes with the memory's output zeroed (eval.memory_off)
#   eae eval masked  masked hyperlink prediction on the held-out test articles (Table 2),
#                    5 maskings pooled
#   (EaE) eae eval topk   the same with the memory reading only the top K entities ($TOPK, Table 7)
#   (EaE, real text) eae eval masked   again with the memory's output zeroed
# Skips what is done.   experiments/regime/eval.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. experiments/regime/settings.sh
mkdir -p "$STUDY/logs"  # a study of FROM_STUDY's models has none yet
pids=()
while read -r w z v s cell; do
  (
    export MLFLOW_TRACKING_URI; MLFLOW_TRACKING_URI=$(store "$cell")
    # shellcheck disable=SC2046
    grep -q "^MLflow run:" "$STUDY/logs/lama-$cell.log" 2>/dev/null ||
      eae eval lama --model "$MODELS/$cell" --data $(probe_data "$w") $(task_resources) \
        --set eval.max_per_relation="$PROBES" --set eval.run_name="lama-$cell" > "$STUDY/logs/lama-$cell.log" 2>&1
    # shellcheck disable=SC2046
    [ "$v" = no_eae ] || [ "$v" = mm ] || grep -q "^MLflow run:" "$STUDY/logs/lama-off-$cell.log" 2>/dev/null ||
      eae eval lama --model "$MODELS/$cell" --data $(probe_data "$w") $(task_resources) \
        --set eval.max_per_relation="$PROBES" --set eval.memory_off=true \
        --set eval.run_name="lama-off-$cell" > "$STUDY/logs/lama-off-$cell.log" 2>&1
    # shellcheck disable=SC2046
    [ "$v" = no_eae ] || [ "$v" = mm ] || [ -z "$TOPK" ] || grep -q "^MLflow run:" "$STUDY/logs/topk-$cell.log" 2>/dev/null ||
      eae eval topk --model "$MODELS/$cell" --data "$(data_dir "$w")" --split test $(task_resources) \
        --set eval.ks="$TOPK" --set eval.mask_draws=5 --set eval.batch_size=128 --set eval.run_name="topk-$cell" \
        > "$STUDY/logs/topk-$cell.log" 2>&1
    # shellcheck disable=SC2046
    grep -q "^MLflow run:" "$STUDY/logs/masked-$cell.log" 2>/dev/null ||
      eae eval masked --model "$MODELS/$cell" --data "$(data_dir "$w")" --split test $(task_resources) \
        --set eval.mask_draws=5 --set eval.batch_size=128 --set eval.run_name="masked-$cell" \
        > "$STUDY/logs/masked-$cell.log" 2>&1
    # EaE on real text: the masked hyperlinks again with the memory's output zeroed (its probes
    # and fanoutqa have that figure; the synthetic worlds have it for QA and fact recall)
    # shellcheck disable=SC2046
    ! is_real "$w" || [ "$v" = no_eae ] || [ "$v" = mm ] || grep -q "^MLflow run:" "$STUDY/logs/masked-off-$cell.log" 2>/dev/null ||
      eae eval masked --model "$MODELS/$cell" --data "$(data_dir "$w")" --split test $(task_resources) \
        --set eval.mask_draws=5 --set eval.batch_size=128 --set eval.memory_off=true --set eval.run_name="masked-off-$cell" \
        > "$STUDY/logs/masked-off-$cell.log" 2>&1
  ) &
  pids+=($!)
done < <(pretrained_cells)
say "evaluating ${#pids[@]} cell(s) side by side"
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
while read -r w z v s; do
  cell=$(cell_name "$w" "$z" "$v" "$s")
  [ -f "$STUDY/logs/lama-$cell.log" ] || continue
  echo "$cell: $(grep -hE "^lama/(synth/stated|geonames)/entity_accuracy|^eae: error" "$STUDY/logs/lama-$cell.log" | tr -s ' ' | tail -1)" \
    "| $(grep -hE "^test/entity_accuracy|^eae: error" "$STUDY/logs/masked-$cell.log" 2>/dev/null | tr -s ' ' | tail -1)"
done < <(cells)
exit $status
