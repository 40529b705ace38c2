#!/usr/bin/env bash
# EaE vs No-EaE on the synthetic world's closed-book questions, same pretraining and
# fine-tuning budget (issue 5's note). CPU, ~15 minutes on 2 cores.
#   experiments/synth_qa.sh [ENTITIES] [PRETRAIN_STEPS] [FINETUNE_STEPS] [OUT]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
entities="${1:-1000}"; pre="${2:-600}"; ft="${3:-300}"; out="$(realpath -m "${4:-runs/synth-qa}")"
eae=.venv/bin/eae
export MLFLOW_TRACKING_URI="sqlite:///$out/mlflow.db"
mkdir -p "$out"
$eae data synth --entities "$entities" --seed 0 --out "$out/world"
$eae data build --dump "$out/world/world.xml" --out "$out/data" --dev-fraction 0.05 --test-fraction 0.05 --shard-rows 200
n=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['counts']['entities'])" "$out/data/manifest.json")
for preset in tiny no_eae_tiny; do
  if [ "$preset" = no_eae_tiny ]; then extra=(--set model.use_entity_memory=false); else extra=(); fi
  $eae pretrain --preset tiny --data "$out/data" --max-steps "$pre" --num-workers 1 --name "pre-$preset" \
    --out "$out/models/$preset" --set model.num_entities="$n" --set model.max_length=128 \
    --set train.batch_size=32 --set train.lr=2e-3 --set train.cpus_per_worker=1 --set train.log_every=100 \
    --set train.checkpoint_every="$pre" --set train.eval_batches=0 --set train.storage_path="$out/ray" \
    --set train.register_as=null "${extra[@]}"
  $eae finetune qa --init "$out/models/$preset" --data "synth:$out/world" --max-steps "$ft" --lr 1e-3 \
    --batch-size 32 --cpus 2 --set finetune.run_name="qa-$preset" --set finetune.log_every=50
done
$eae compare pre-tiny pre-no_eae_tiny qa-tiny qa-no_eae_tiny
