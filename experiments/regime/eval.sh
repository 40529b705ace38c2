#!/usr/bin/env bash
# Stage 4 of the regime study, for every pretrained cell, side by side:
#   eae eval lama    fact recall: a cloze probe per fact of the world ("[X] was born in
#                    [MASK] ."), split into facts pretraining read (their article is in the
#                    training split: eval.stated_in) and the rest, beside the prior-only baseline;
#                    for the real-text world `vital`: $REAL_PROBES (settings.sh)
#   (EaE)            the same probes with the memory's output zeroed (eval.memory_off_run:
#                    the run lama-off-CELL, from the same process)
#   eae eval masked  masked hyperlink prediction on the held-out test articles (Table 2),
#                    5 maskings pooled
#   (EaE) eae eval topk   the same with the memory reading only the top K entities ($TOPK, Table 7)
#   (EaE, real text) eae eval masked   again with the memory's output zeroed
# Skips what is done.   experiments/regime/eval.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. experiments/regime/settings.sh
mkdir -p "$STUDY/logs"  # a study of FROM_STUDY's models has none yet
# KIND EVAL [--set ...]: `eae eval EVAL` of this cell ($w, $cell) as the run KIND-$cell, logged to
# $STUDY/logs/KIND-$cell.log; skipped when that log records a finished run
once() {
  local kind=$1 what=$2 log="$STUDY/logs/$1-$cell.log"
  shift 2
  grep -q "^MLflow run:" "$log" 2>/dev/null && return
  case $what in
    lama) set -- --data $(probe_data "$w") --set eval.max_per_relation="$PROBES" "$@" ;;
    topk|masked) set -- --data "$(data_dir "$w")" --split test --set eval.mask_draws=5 --set eval.batch_size=128 "$@" ;;
  esac
  # shellcheck disable=SC2046
  eae eval "$what" --model "$MODELS/$cell" "$@" $(task_resources) --set eval.run_name="$kind-$cell" > "$log" 2>&1
}
pids=()
while read -r w z v s cell; do
  (
    export MLFLOW_TRACKING_URI; MLFLOW_TRACKING_URI=$(store "$cell")
    # EaE: the probes again with its memory's output zeroed, as the run lama-off-$cell, from
    # the same process (eval.memory_off_run: one model load). A study from before that option
    # ran lama-off as an evaluation of its own: where its lama is done alone, so is lama-off.
    lama_log="$STUDY/logs/lama-$cell.log"
    if ! has_memory "$v"; then once lama lama
    elif grep -q "^MLflow run:" "$lama_log" 2>/dev/null && ! grep -q "^MLflow run (memory off" "$lama_log"; then
      once lama-off lama --set eval.memory_off=true
    else once lama lama --set eval.memory_off_run="lama-off-$cell"
    fi
    ! has_memory "$v" || [ -z "$TOPK" ] || once topk topk --set eval.ks="$TOPK"
    once masked masked
    # EaE on real text: the masked hyperlinks again with the memory's output zeroed (its probes
    # and fanoutqa have that figure; the synthetic worlds have it for QA and fact recall)
    ! is_real "$w" || ! has_memory "$v" || once masked-off masked --set eval.memory_off=true
  ) &
  pids+=($!)
done < <(pretrained_cells)
say "evaluating ${#pids[@]} cell(s) side by side"
status=0; wait_all "${pids[@]}" || status=1
while read -r w z v s; do
  cell=$(cell_name "$w" "$z" "$v" "$s")
  [ -f "$STUDY/logs/lama-$cell.log" ] || continue
  echo "$cell: $(grep -hE "^lama/(synth/stated|geonames)/entity_accuracy|^eae: error" "$STUDY/logs/lama-$cell.log" | tr -s ' ' | tail -1)" \
    "| $(grep -hE "^test/entity_accuracy|^eae: error" "$STUDY/logs/masked-$cell.log" 2>/dev/null | tr -s ' ' | tail -1)"
done < <(cells)
exit $status
