# The regime study (docs/results.md): EaE and No-EaE at equal steps and tokens over synthetic
# worlds of growing size, so that the facts a model must hold grow against its transformer's
# parameters. Sourced by every stage script (data, pretrain, finetune, eval, collect); each
# setting can be overridden from the environment, e.g. WORLDS="5000" SEEDS=0 STEPS=200.
#
# Cells are (world, size, variant, seed); a cell's pretraining, QA fine-tuning and evaluations
# log to one MLflow store of its own ($STUDY/mlruns/<cell>, a file store: the cells run side by
# side and each store has one writer at a time), which collect.sh packs for
# experiments/results_tables.py.
STUDY=$(realpath -m "${STUDY:-runs/regime}")
# FROM_STUDY: another study whose worlds, data and models (eae pretrain --out) this one reads, to
# fine-tune and evaluate its models again at another QA recipe, with MLflow stores and logs of
# its own (pretrain.sh skips a cell whose model exists)
FROM_STUDY=$(realpath -m "${FROM_STUDY:-$STUDY}")
MODELS=$FROM_STUDY/models
# entities per synthetic world (world seed 0); "20000r4": 20,000 entities whose articles state
# their facts 4 times (`eae data synth --renderings 4`), built with a context per paragraph
# (`eae data build --paragraph-contexts`) so that no context holds a fact twice
WORLDS=${WORLDS:-"5000 100000"}
# "vital": real text instead of a synthetic world (issue 23 item 5): Wikipedia's Vital Articles'
# lead sections linked by alias matching (`eae data vital`) built together with the gensim
# sample dump (real hyperlinks); its QA is fanoutqa's single-hop questions, its fact probes
# $REAL_PROBES (GeoNames, countryinfo, WordNet). "vital<N>" (e.g. vital2000): the same text with
# its entity vocabulary cut to the N most frequent link targets (`eae data build --entities`, the
# paper's cut at 1M): at 2,000, ~12 linked mentions per entity instead of 2.3, the paper's ~15
# (round 15 found the full vocabulary's table memorising its few mentions). SAMPLE_DUMP: the gensim
# sample's path (default: found in the installed gensim, never imported)
REAL_PROBES=${REAL_PROBES:-"geonames,countryinfo,wordnet"}
SAMPLE_DUMP=${SAMPLE_DUMP:-}
SIZES=${SIZES:-"small"}               # model presets (eae_model/config.py): small, medium, minilm (size_set)
VARIANTS=${VARIANTS:-"eae no_eae"}    # the paper's switches (variant_set below)
SEEDS=${SEEDS:-"0 1 2"}               # training seeds (model initialisation, masks, QA order)
STEPS=${STEPS:-5000}                  # pretraining steps, the same for every cell
BATCH=${BATCH:-512}                   # contexts per step
LR=${LR:-1e-3}                        # Adam: linear warmup, then linear decay (the paper's shape)
WARMUP=${WARMUP:-0.05}                # the warmup's share of the steps (train.warmup_fraction)
MEMORY_LR_SCALE=${MEMORY_LR_SCALE:-1} # the entity table's and memory layer's lr as a multiple of LR (train.memory_lr_scale)
MEMORY_LAYER_NORM=${MEMORY_LAYER_NORM:-true}  # false: X3 = X2 + X1, no LayerNorm after the memory (model.memory_layer_norm)
MEMORY_EL_WEIGHT=${MEMORY_EL_WEIGHT:-1}  # the memory's entity-linking loss weight (model.weight_memory_el; EaE-unsup: none)
INIT_ENCODER=${INIT_ENCODER:-true}    # SIZES=minilm: start from the shipped MiniLM encoder; false: train its shape from scratch
case $INIT_ENCODER in true|false) ;; *) echo "INIT_ENCODER must be true or false, got '$INIT_ENCODER'" >&2; exit 2 ;; esac
MEMORY_QUERY_DETACHED=${MEMORY_QUERY_DETACHED:-false}  # true: no memory gradient into the l0 layers (model.memory_query_detached)
# N: each batch padded to its longest context rounded up to N, not to the model's max_length (train.pad_multiple:
# the same model on fewer padded tokens; 16: 0.71x a step with 6 cells side by side on one H100, 1.00x for one
# alone, docs/performance.md); 0: the job's default. Off here so earlier rounds' commands train as they did
PAD_MULTIPLE=${PAD_MULTIPLE:-0}
# false: every epoch reads the rows in file order (train.shuffle_rows), as rounds 1-8 of
# docs/results.md did before the shuffle existed: their commands reproduce them with it
SHUFFLE_ROWS=${SHUFFLE_ROWS:-true}
# (several recipes at once, each a study of its own: RECIPES="NAME:LR=...,WARMUP=... ..." experiments/regime/recipes.sh)
QA_STEPS=${QA_STEPS:-2000}; QA_BATCH=${QA_BATCH:-128}; QA_LR=${QA_LR:-1e-3}
PROBES=${PROBES:-1000}                # synthetic probes kept per relation (eae eval lama)
TOPK=${TOPK-"1,10,100,all"}           # EaE: the memory's K at inference for eae eval topk (empty: skip)
DEVICE=${DEVICE:-$(command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 && echo gpu || echo cpu)}
# train.time_budget_s of each pretraining launch (unset: none), or train.deadline, a UNIX time
# at which every cell pauses whenever its workers started (STOP_AT=$(( $(date +%s) + 500 ))); a
# paused cell continues when pretrain.sh runs again
BUDGET_S=${BUDGET_S:-}
STOP_AT=${STOP_AT:-}
LOG_EVERY=${LOG_EVERY:-100}            # pretraining steps per logged window (a time limit is checked at each)
EAE_CMD=${EAE_CMD:-$( [ -x .venv/bin/eae ] && echo .venv/bin/eae || echo eae )}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export MLFLOW_ALLOW_FILE_STORE=true

eae() { $EAE_CMD "$@"; }

cells() {  # one line per cell: WORLD SIZE VARIANT SEED
  for w in $WORLDS; do for z in $SIZES; do for v in $VARIANTS; do for s in $SEEDS; do
    echo "$w $z $v $s"
  done; done; done; done
}
ncells() { cells | wc -l; }
pretrained_cells() {  # the cells with a model, one line each: WORLD SIZE VARIANT SEED CELL
  cells | while read -r w z v s; do
    cell=$(cell_name "$w" "$z" "$v" "$s")
    if [ -f "$MODELS/$cell/config.json" ]; then echo "$w $z $v $s $cell"; else say "$cell: not pretrained yet" >&2; fi
  done
}
cell_name() { echo "w$1-$2-$3-s$4"; }
store() { echo "file://$STUDY/mlruns/$1"; }  # a cell's MLflow store
world_dir() { echo "$FROM_STUDY/worlds/w$1"; }
world_entities() { echo "${1%%r*}"; }                      # 20000r4 -> 20000
world_renderings() { case "$1" in *r*) echo "${1##*r}" ;; *) echo 1 ;; esac; }  # 20000r4 -> 4
data_dir() { echo "$FROM_STUDY/data/w$1"; }
has_data() { [ -f "$(data_dir "$1")/manifest.json" ]; }   # data.sh built the world's shards
is_real() { [[ $1 =~ ^vital[0-9]*$ ]]; }                   # real text, not a synthetic world
real_entities() { echo "${1#vital}"; }                     # vital2000 -> 2000, vital -> "" (every target)
qa_data() {  # the QA dataset spec of a world (eae finetune qa --data)
  if is_real "$1"; then echo fanoutqa; else echo "synth:$(world_dir "$1")"; fi
}
probe_data() {  # the fact probes of a world (eae eval lama --data), and their split by what pretraining read
  if is_real "$1"; then echo "$REAL_PROBES"; else echo "synth:$(world_dir "$1") --set eval.stated_in=$(data_dir "$1")"; fi
}

variant_set() {  # the paper's ablations as switches of a preset
  case "$1" in
    eae) echo "" ;;
    no_eae) echo "--set model.use_entity_memory=false" ;;
    eae_unsup) echo "--set model.memory_el_supervision=false --set model.k_inference=null" ;;
    mm) echo "--set model.use_entity_memory=false --set model.use_entity_pred=false --set model.use_mention_detection=false" ;;
    *) echo "unknown variant $1" >&2; return 2 ;;
  esac
}

has_memory() { case $1 in eae|eae_unsup) true ;; *) false ;; esac; }  # a variant with the entity memory

size_set() {  # a preset's own pretraining settings: minilm starts from the MiniLM encoder that ships offline (INIT_ENCODER)
  case "$1" in
    minilm) if [ "$INIT_ENCODER" = true ]; then echo "--set train.init_encoder=minilm"; fi ;;
    *) echo "" ;;
  esac
}

# Every cell side by side: each pretraining worker (and each evaluation task) gets an equal
# share of a GPU, the cells spread over the machine's GPUS (Ray puts a fractional share on a
# GPU with that much left: ceil(cells / GPUS) shares fit on each); on CPUs each gets half a
# core (Ray's logical CPUs). The share is rounded down to 3 decimals: rounded to nearest, 6 cells
# got 0.167 each (1.002 of a GPU), so Ray placed 5 and the sixth waited, its worker group timed out
# after 60 s and started only when another cell stopped (rounds 19 and 24's "stalled" cell).
# SHARE_CELLS: the cells sharing the machine (default this study's; experiments/regime/recipes.sh sets it
# when several recipes' studies run at once).
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)}
share() { awk -v n="${SHARE_CELLS:-$(ncells)}" -v g="$GPUS" 'BEGIN { g = g < 1 ? 1 : g; printf "%.3f", int(1000 / int((n + g - 1) / g)) / 1000 }'; }
device_set() {
  if [ "$DEVICE" = gpu ]; then
    echo "--set train.use_gpu=true --set train.gpus_per_worker=$(share) --set train.cpus_per_worker=1"
  else
    echo "--set train.use_gpu=false --set train.cpus_per_worker=0.5"
  fi
}
task_resources() {  # eae finetune / eae eval: the Ray task's share
  if [ "$DEVICE" = gpu ]; then echo "--gpus $(share) --cpus 1"; else echo "--gpus 0 --cpus 0.5"; fi
}
say() { echo "[regime $(date -u +%T)] $*"; }
wait_all() {  # PID...: waits for every one of a stage's side-by-side jobs; 1 when any failed
  local p failed=0
  for p in "$@"; do wait "$p" || failed=1; done
  return $failed
}
