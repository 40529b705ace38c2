#!/usr/bin/env bash
# The paper's findings on the synthetic world (issue 6): EaE, No-EaE, MM and EaE-unsup
# pretrained with the same budget (tiny sizes, same steps, batch, lr, data and seed), then
#   masked hyperlink prediction (Table 2), LAMA-style probes (Table 3), QA fine-tuning with the
#   same budget (Table 4), top-K at inference (Table 7), QA analysis (Figure 3) and the
#   prediction overlap / oracle of EaE and No-EaE (Table 8).
# CPU, 2 cores: ~40 minutes at the defaults. Results: docs/results/cpu-reproduction.md.
#   experiments/reproduce.sh [ENTITIES] [PRETRAIN_STEPS] [FINETUNE_STEPS] [OUT] [STAGES]
# STAGES: "train eval" (default), or one of them (eval reuses the trained models in OUT); "wiki"
# adds EaE and No-EaE on the real Wikipedia sample that ships in gensim (same budget), probed with
# the real relations (GeoNames, countryinfo, WordNet, bsdgames) and typed/related with them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
entities="${1:-1000}"; pre="${2:-600}"; ft="${3:-300}"; out="$(realpath -m "${4:-runs/reproduce}")"
stages="${5:-train eval}"
eae=.venv/bin/eae
export MLFLOW_TRACKING_URI="sqlite:///$out/mlflow.db"
mkdir -p "$out"
variants=(${VARIANTS:-eae no_eae mm eae_unsup})  # VARIANTS="eae no_eae": a subset
# The paper's ablations as switches of the tiny preset (eae_model/config.py PRESETS).
model_set() {
  case "$1" in
    eae) echo "" ;;
    no_eae) echo "--set model.use_entity_memory=false" ;;
    mm) echo "--set model.use_entity_memory=false --set model.use_entity_pred=false --set model.use_mention_detection=false" ;;
    eae_unsup) echo "--set model.memory_el_supervision=false --set model.k_inference=null" ;;
  esac
}
if [[ " $stages " == *" train "* ]]; then
  $eae data synth --entities "$entities" --seed 0 --out "$out/world"
  $eae data build --dump "$out/world/world.xml" --out "$out/data" --dev-fraction 0.05 --test-fraction 0.05 --shard-rows 200
  n=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['counts']['entities'])" "$out/data/manifest.json")
  for v in "${variants[@]}"; do
    # shellcheck disable=SC2046
    $eae pretrain --preset tiny --data "$out/data" --max-steps "$pre" --num-workers 1 --name "pre-$v" \
      --out "$out/models/$v" --set model.num_entities="$n" --set model.max_length=128 \
      --set train.batch_size=32 --set train.lr=2e-3 --set train.cpus_per_worker=1 --set train.log_every=100 \
      --set train.checkpoint_every="$pre" --set train.eval_batches=0 --set train.storage_path="$out/ray" \
      --set train.register_as=null $(model_set "$v")
    if [ "$v" != mm ]; then  # MM has no entity head: it cannot answer with entities
      $eae finetune qa --init "$out/models/$v" --data "synth:$out/world" --max-steps "$ft" --lr 1e-3 \
        --batch-size 32 --cpus 2 --out "$out/qa/$v" --set finetune.run_name="qa-$v" --set finetune.log_every=50
    fi
  done
fi
if [[ " $stages " == *" eval "* ]]; then
  for v in "${variants[@]}"; do
    $eae eval masked --model "$out/models/$v" --data "$out/data" --split test --set eval.mask_draws=5 \
      --set eval.run_name="masked-$v"
    $eae eval lama --model "$out/models/$v" --data "synth:$out/world" --set eval.run_name="lama-$v"
    if [ "$v" != mm ]; then
      $eae eval typing --model "$out/models/$v" --data "synth:$out/world,$out/data" --set eval.steps=300 \
        --set eval.lr=1e-3 --set eval.run_name="typing-$v"
      $eae eval relations --model "$out/models/$v" --data "synth:$out/world,$out/data" --set eval.steps=300 \
        --set eval.lr=1e-3 --set eval.run_name="relations-$v"
    fi
    if [ "$v" != mm ]; then
      $eae eval topk --model "$out/models/$v" --data "$out/data" --qa-model "$out/qa/$v" \
        --qa-data "synth:$out/world" --split test --set eval.mask_draws=5 --set eval.run_name="topk-$v"
    fi
  done
  $eae eval analysis --runs qa-eae,qa-no_eae --data "$out/data" --split test --set eval.run_name=analysis-eae-vs-no_eae
  $eae eval overlap --runs qa-eae,qa-no_eae --split test --set eval.run_name=overlap-eae-vs-no_eae
  $eae compare pre-eae pre-no_eae pre-mm pre-eae_unsup masked-eae masked-no_eae masked-mm masked-eae_unsup \
    qa-eae qa-no_eae qa-eae_unsup topk-eae topk-no_eae topk-eae_unsup
fi
if [[ " $stages " == *" wiki "* ]]; then
  wiki="$out/wiki"
  [ -f "$wiki/data/manifest.json" ] || $eae data build --out "$wiki/data" --shard-rows 200
  n=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['counts']['entities'])" "$wiki/data/manifest.json")
  for v in ${WIKI_VARIANTS:-eae no_eae}; do
    # shellcheck disable=SC2046
    [ -f "$wiki/models/$v/config.json" ] || $eae pretrain --preset tiny --data "$wiki/data" --max-steps "$pre" --num-workers 1 --name "wiki-pre-$v" \
      --out "$wiki/models/$v" --set model.num_entities="$n" --set model.max_length=128 \
      --set train.batch_size=32 --set train.lr=2e-3 --set train.cpus_per_worker=1 --set train.log_every=100 \
      --set train.checkpoint_every="$pre" --set train.eval_batches=0 --set train.storage_path="$wiki/ray" \
      --set train.register_as=null $(model_set "$v")
    $eae eval masked --model "$wiki/models/$v" --data "$wiki/data" --split test --set eval.mask_draws=5 \
      --set eval.run_name="wiki-masked-$v"
    $eae eval lama --model "$wiki/models/$v" --data geonames,countryinfo,wordnet,bsdgames --set eval.run_name="wiki-lama-$v"
    $eae eval typing --model "$wiki/models/$v" --data "wiki:$wiki/data" --set eval.steps=300 --set eval.lr=1e-3 \
      --set eval.run_name="wiki-typing-$v"
    $eae eval relations --model "$wiki/models/$v" --data "wiki:$wiki/data" --set eval.steps=300 --set eval.lr=1e-3 \
      --set eval.run_name="wiki-relations-$v"
  done
fi
