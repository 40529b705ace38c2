#!/usr/bin/env bash
# Stage 3 of the regime study: closed-book QA fine-tuning of every pretrained cell on its
# world's questions (`eae finetune qa --data synth:WORLD`, fanoutqa for the real-text world
# `vital`: train questions for training; dev and
# test questions are about facts never asked in training), side by side. EM is reported for all
# test questions, for those whose fact pretraining read (finetune.stated_in) and the rest,
# beside the prior-only baseline (the relation's most frequent training answer); for models with
# a memory, test EM again with the memory's output zeroed. Skips done cells.
#   experiments/regime/finetune.sh
#   FROM_STUDY=runs/regime STUDY=runs/regime-qa600 QA_STEPS=600 QA_LR=3e-4 experiments/regime/finetune.sh
#     (another QA recipe for the same models, a study of its own: compare with results_tables.py --versus)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. experiments/regime/settings.sh
mkdir -p "$STUDY/logs"  # a study of FROM_STUDY's models has none yet
pids=()
while read -r w z v s cell; do
  grep -q "^MLflow run:" "$STUDY/logs/qa-$cell.log" 2>/dev/null && continue
  [ "$v" = mm ] && continue  # MM has no EntityPred head: no answer entity to predict (as in the paper)
  off=""  # a model with a memory: test again with its output zeroed (test/em_memory_off)
  ! has_memory "$v" || off="--set finetune.memory_off_eval=true"
  stated=""  # a synthetic world: EM split by whether pretraining read the question's fact
  is_real "$w" || stated="--set finetune.stated_in=$(data_dir "$w")"
  # shellcheck disable=SC2046,SC2086
  MLFLOW_TRACKING_URI=$(store "$cell") eae finetune qa --init "$MODELS/$cell" --data "$(qa_data "$w")" \
    --max-steps "$QA_STEPS" --batch-size "$QA_BATCH" --lr "$QA_LR" $(task_resources) \
    --set finetune.seed="$s" --set finetune.run_name="qa-$cell" --set finetune.experiment=regime-qa \
    --set finetune.log_every=200 $stated $off > "$STUDY/logs/qa-$cell.log" 2>&1 &
  pids+=($!)
done < <(pretrained_cells)
say "fine-tuning ${#pids[@]} cell(s) side by side"
status=0; wait_all "${pids[@]}" || status=1
while read -r w z v s; do
  cell=$(cell_name "$w" "$z" "$v" "$s")
  [ -f "$STUDY/logs/qa-$cell.log" ] && echo "$cell: $(grep -hE "^(test:|eae: error)" "$STUDY/logs/qa-$cell.log" | tail -1)"
done < <(cells)
exit $status
