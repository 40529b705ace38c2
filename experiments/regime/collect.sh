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
# (predictions/test.jsonl: accuracy by answer frequency, Figure 3), copied and slimmed to the
# fields results_tables.py reads (slim_predictions.py: a tenth of the archive)
staged=$(mktemp -d)
trap 'rm -rf "$staged"' EXIT
(cd "$STUDY" && find mlruns -type f \( ! -path '*/artifacts/*' -o -path '*/artifacts/predictions/test.jsonl' \) -print0) |
  tar -C "$STUDY" --null -T - -cf - | tar -C "$staged" -xf -
"$PYTHON" experiments/regime/slim_predictions.py "$staged" >&2 ||  # a failure here must not lose the archive
  say "slim_predictions.py failed: the archive keeps its predictions whole"
tar -C "$staged" -cf - mlruns | xz -T0 > "$out"
say "$(du -h "$out" | cut -f1) $out ($(ls "$STUDY/mlruns" | wc -l) cell stores)"
