#!/usr/bin/env bash
# Several training recipes of the regime study side by side: COMMAND (a stage script, possibly
# behind `timeout`) runs once per recipe in $RECIPES, all at once, each in a study of its own,
# $STUDY/<name> (two recipes' cells have the same names), sharing $STUDY's worlds and data, with
# the recipe's NAME=VALUE settings exported (settings.sh reads them) and every recipe's cells an
# equal share of the GPUs (SHARE_CELLS). Lines are prefixed with [name]; the exit status is the
# last failing recipe's (0 when all succeed).
#   experiments/regime/data.sh        # once, in $STUDY
#   RECIPES="lr1e-3:LR=1e-3 lr3e-4:LR=3e-4,WARMUP=0.25" experiments/regime/recipes.sh experiments/regime/pretrain.sh
#   RECIPES=... experiments/regime/recipes.sh experiments/regime/finetune.sh     # then eval.sh
#   STUDY=runs/regime/lr1e-3 experiments/regime/collect.sh runs/regime-lr1e-3.mlruns.tar.xz   # one store per recipe
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ $# -gt 0 ] && [ -n "${RECIPES:-}" ] || { echo "usage: RECIPES=\"NAME:SETTING=VALUE,... ...\" $0 COMMAND..." >&2; exit 2; }
. experiments/regime/settings.sh  # STUDY, ncells
read -ra recipes <<< "$RECIPES"
for r in "${recipes[@]}"; do
  [[ $r =~ ^[A-Za-z0-9._-]+:([A-Z_]+=[^,]*)(,[A-Z_]+=[^,]*)*$ ]] ||
    { echo "recipe '$r': expected NAME:SETTING=VALUE[,SETTING=VALUE...] (e.g. lr1e-3:LR=1e-3,WARMUP=0.25)" >&2; exit 2; }
done

with_recipe() (  # RECIPE COMMAND...: COMMAND in RECIPE's study, its settings exported (a subshell)
  r=$1; shift
  export STUDY="$STUDY/${r%%:*}"
  mkdir -p "$STUDY"
  for d in worlds data; do [ -e "$STUDY/$d" ] || [ -L "$STUDY/$d" ] || ln -s "../$d" "$STUDY/$d"; done
  IFS=, read -ra sets <<< "${r#*:}"
  for kv in "${sets[@]}"; do export "${kv?}"; done
  "$@"
)

SHARE_CELLS=0  # every recipe's cells, for settings.sh's share of a GPU
for r in "${recipes[@]}"; do
  n=$(with_recipe "$r" ncells) || exit 2
  SHARE_CELLS=$(( SHARE_CELLS + n ))
done
export SHARE_CELLS
pids=()
for r in "${recipes[@]}"; do
  (
    with_recipe "$r" "$@" 2>&1 | sed -u "s|^|[${r%%:*}] |"
    exit "${PIPESTATUS[0]}"
  ) &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
