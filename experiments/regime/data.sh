#!/usr/bin/env bash
# Stage 1 of the regime study: each synthetic world (`eae data synth`, world seed 0, its facts
# stated once or, for a world named like 20000r4, 4 times) and its pretraining shards (`eae data
# build`: 5% of articles held out for dev, 5% for test), the worlds side by side; the worlds
# `vital` and `vital<N>` are real text instead (settings.sh). Skips what exists.
#   experiments/regime/data.sh        (settings: experiments/regime/settings.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. experiments/regime/settings.sh
mkdir -p "$STUDY/logs"
pids=()
for w in $WORLDS; do
  has_data "$w" && { say "world $w: $(data_dir "$w") exists"; continue; }
  if is_real "$w"; then
    (
      sample=${SAMPLE_DUMP:-$("$PYTHON" -c "from eae_data.wikidump import embedded_dump_path; print(embedded_dump_path())")} &&
      eae data vital --out "$(world_dir "$w")" --redirects "$sample" &&
      n=$(real_entities "$w") &&
      eae data build --dump "$(world_dir "$w")/vital.xml" --dump "$sample" --out "$(data_dir "$w")" \
        --dev-fraction 0.05 --test-fraction 0.05 --shard-rows 5000 --partition-mb 8 ${n:+--entities "$n"}
    ) > "$STUDY/logs/data-w$w.log" 2>&1 &
  else
    (
      r=$(world_renderings "$w")
      eae data synth --entities "$(world_entities "$w")" --renderings "$r" --seed 0 --out "$(world_dir "$w")" &&
      eae data build --dump "$(world_dir "$w")/world.xml" --out "$(data_dir "$w")" --dev-fraction 0.05 \
        --test-fraction 0.05 --shard-rows 5000 --partition-mb 8 $( [ "$r" -gt 1 ] && echo --paragraph-contexts )
    ) > "$STUDY/logs/data-w$w.log" 2>&1 &
  fi
  pids+=($!)
done
status=0; wait_all "${pids[@]}" || status=1
for w in $WORLDS; do
  grep -h "^built" "$STUDY/logs/data-w$w.log" 2>/dev/null | sed "s/^/[world $w] /" || true
  has_data "$w" || { say "world $w failed:"; tail -20 "$STUDY/logs/data-w$w.log"; }
done
exit $status
