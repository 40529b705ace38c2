#!/usr/bin/env bash
# Stage 5 of the regime study: the cells' MLflow stores in one archive (runs, params, metrics,
# tags; without artifacts: checkpoints and per-question predictions were 100+ MB for 12 cells,
# the weights stay in $STUDY/models), for experiments/results_tables.py:
#   experiments/regime/collect.sh OUT.tar.xz
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. experiments/regime/settings.sh
out=$(realpath -m "${1:?usage: collect.sh OUT.tar.xz}")
mkdir -p "$(dirname "$out")"
# every store without its artifacts (models, checkpoints), except the QA runs' predictions
# (predictions/test.jsonl: accuracy by answer frequency, Figure 3)
(cd "$STUDY" && find mlruns -type f \( ! -path '*/artifacts/*' -o -path '*/artifacts/predictions/test.jsonl' \) -print0) |
  tar -C "$STUDY" --null -T - -cf - | xz -T0 > "$out"
say "$(du -h "$out" | cut -f1) $out ($(ls "$STUDY/mlruns" | wc -l) cell stores)"
