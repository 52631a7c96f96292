#!/usr/bin/env bash
# nnU-Net v2 trained on the shared hippocampus cases on an mcseg run's split, then evaluated and
# calibrated by mcseg from its saved probabilities (issue #36; docs/results.md, "Calibrating nnU-Net").
# Optional; never run by CI or the tests. Every step resumes: run the same command again.
#
#   bash scripts/nnunet_calibration.sh SPLIT [STEP]
#
# SPLIT: an mcseg run directory (its split.json) or a split.json; the committed one is
#   docs/results/nnunet_calibration/split.json (that of `python train.py experiment=hippocampus_cpu`).
# STEP (default all, each step whose result is missing, in this order):
#   prepare   the split in nnU-Net's raw layout, nnUNetv2_plan_and_preprocess, splits_final.json (fold 0 =
#             the run's training / validation cases; the test cases are never seen)
#   train     one piece of training (nnUNetTrainer_mcsegEpochs of scripts/nnunet_budget_trainer.py): at
#             most PIECE_MINUTES, then exit 75 with checkpoint_latest.pth; the next call continues
#             with nnU-Net's own `--c`. After the last epoch nnU-Net validates fold 0 and saves its
#             probabilities (`--npz`).
#   predict   nnUNetv2_predict of the test cases with --save_probabilities (checkpoint_final, mirroring)
#   evaluate  mcseg-evaluate-folder on the validation and test folders; mcseg-calibrate-folder fits a
#             temperature on the validation probabilities and writes calibrated test files in
#             nnU-Net's format, which are evaluated again
# Each step copies its small tables (progress.csv, budget.json, summary.json, per_case.csv,
# calibration.json, ...) to RESULTS, to be committed as they come.
# Environment: MCSEG_HIPPOCAMPUS_ROOT (../shared/data/hippocampus), NNUNET_WORK (outputs/nnunet_calibration),
#   RESULTS (docs/results/nnunet_calibration), NNUNET_VENV (.venv-nnunet), NNUNET_CONFIG (3d_fullres),
#   MCSEG_NNUNET_EPOCHS (40), MCSEG_NNUNET_ITERATIONS (25 per epoch), PIECE_MINUTES (40),
#   MCSEG_NNUNET_THREADS (torch threads; default nnU-Net's: every core), nnUNet_n_proc_DA (the cores),
#   MCSEG_RUN (the mcseg run whose eval/test goes beside nnU-Net's in RESULTS/mcseg and table.md),
#   MCSEG_PY (.venv/bin/python), GLIBC_TUNABLES (default: glibc keeps freed memory, mmap and trim thresholds 1 GiB, as mcseg's own
#   processes do (mcseg.runtime.keep_freed_memory): without it a CPU step spends a third of its time in page
#   faults, docs/benchmarks.md; set it empty to run nnU-Net's processes with glibc's defaults).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash scripts/nnunet_calibration.sh SPLIT [prepare|train|predict|evaluate|all]" >&2; exit 2; }
split=$(realpath "$1")
step=${2:-all}
data=$(realpath "${MCSEG_HIPPOCAMPUS_ROOT:-../shared/data/hippocampus}")
work=$(mkdir -p "${NNUNET_WORK:-outputs/nnunet_calibration}" && cd "${NNUNET_WORK:-outputs/nnunet_calibration}" && pwd)
results=$(mkdir -p "${RESULTS:-docs/results/nnunet_calibration}" && cd "${RESULTS:-docs/results/nnunet_calibration}" && pwd)
config=${NNUNET_CONFIG:-3d_fullres}
export MCSEG_NNUNET_EPOCHS=${MCSEG_NNUNET_EPOCHS:-40} MCSEG_NNUNET_ITERATIONS=${MCSEG_NNUNET_ITERATIONS:-25}
export MCSEG_NNUNET_PIECE_S=$(( ${PIECE_MINUTES:-40} * 60 ))
export GLIBC_TUNABLES=${GLIBC_TUNABLES-glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824}
mcseg_py=${MCSEG_PY:-.venv/bin/python}
id=904  # a dataset id of its own: a user's nnU-Net folders may already hold Dataset004
name=Dataset${id}_Hippocampus
source scripts/nnunet_venv.sh
nnunet_venv "${NNUNET_VENV:-.venv-nnunet}" "$work"
venv=${NNUNET_VENV:-.venv-nnunet}
fold=$nnUNet_results/$name/nnUNetTrainer_mcsegEpochs__nnUNetPlans__$config/fold_0
raw=$nnUNet_raw/$name
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

prepare() {
    [ -f "$nnUNet_preprocessed/$name/splits_final.json" ] && { log "prepare: done before"; return; }
    "$mcseg_py" scripts/peer_nnunet.py convert "$split" "$data" "$work" $id
    "$venv/bin/nnUNetv2_plan_and_preprocess" -d $id -c "$config" -np "$(nproc)" --verify_dataset_integrity
    "$mcseg_py" scripts/peer_nnunet.py splits "$split" "$nnUNet_preprocessed/$name"
    cp "$split" "$results/split.json" 2>/dev/null || true
    cp "$nnUNet_preprocessed/$name/nnUNetPlans.json" "$results/nnUNetPlans.json"
}

train() {
    [ -f "$fold/checkpoint_final.pth" ] && [ -d "$fold/validation" ] && { log "train: done before"; return; }
    local resume=()
    [ -f "$fold/checkpoint_latest.pth" ] || [ -f "$fold/checkpoint_final.pth" ] && resume=(--c)
    log "train: $config fold 0, $MCSEG_NNUNET_EPOCHS epochs of $MCSEG_NNUNET_ITERATIONS iterations, piece of at most" \
        "$MCSEG_NNUNET_PIECE_S s ${resume[*]:-(a new run)}; load average $(load)"
    local rc=0
    "$venv/bin/nnUNetv2_train" $id "$config" 0 -tr nnUNetTrainer_mcsegEpochs -device cpu --npz "${resume[@]}" || rc=$?
    cp "$fold/mcseg_progress.csv" "$results/progress.csv"
    cp "$fold/mcseg_budget.json" "$results/budget.json" 2>/dev/null || true
    log "train: exit $rc; load average $(load); $(tail -1 "$results/progress.csv")"
    [ $rc -eq 75 ] && { log "train: piece ended; run the same command again to continue (nnU-Net's --c)"; exit 75; }
    [ $rc -eq 0 ] || exit $rc
}

predict() {
    [ -f "$work/test/.done" ] && { log "predict: done before"; return; }
    local t0=$SECONDS
    rm -rf "$work/test"
    "$venv/bin/nnUNetv2_predict" -i "$raw/imagesTs" -o "$work/test" -d $id -c "$config" -f 0 \
        -tr nnUNetTrainer_mcsegEpochs -chk checkpoint_final.pth -device cpu --save_probabilities -npp 1 -nps 1
    echo "{\"predict_test_s\": $((SECONDS - t0))}" > "$results/predict.json"
    touch "$work/test/.done"
}

# the small tables of one mcseg-evaluate-folder output into RESULTS/<name>
keep() {
    mkdir -p "$results/$2"
    cp "$1"/{summary.json,per_case.csv,provenance.json} "$results/$2/"
    cp "$1"/reliability*.csv "$results/$2/" 2>/dev/null || true
}

evaluate() {
    local splits=$nnUNet_preprocessed/$name/splits_final.json
    "$mcseg_py" -m mcseg.evaluate_folder "$fold/validation" "$raw" --format nnunet --splits "$splits" --fold 0 \
        --no-figures --overwrite -o "$work/eval/validation"
    keep "$work/eval/validation" validation
    "$mcseg_py" -m mcseg.evaluate_folder "$work/test" "$work/labelsTs" --format nnunet --no-figures --overwrite -o "$work/eval/test"
    keep "$work/eval/test" test
    rm -rf "$work/test_temperature"
    "$mcseg_py" -m mcseg.calibrate_folder --fit "$fold/validation" --reference "$raw" --splits "$splits" --fold 0 \
        --apply "$work/test" -o "$work/test_temperature"
    cp "$work/test_temperature/calibration.json" "$results/calibration.json"
    "$mcseg_py" -m mcseg.evaluate_folder "$work/test_temperature" "$work/labelsTs" --format nnunet --no-figures \
        --overwrite -o "$work/eval/test_temperature"
    keep "$work/eval/test_temperature" test_temperature
    [ -n "${MCSEG_RUN:-}" ] && keep "$MCSEG_RUN/eval/test" mcseg
    "$mcseg_py" scripts/peer_nnunet.py table "$results"
    log "evaluate: tables in $results"
}

case $step in
    prepare|train|predict|evaluate) $step ;;
    all) prepare; train; predict; evaluate ;;
    *) echo "unknown step '$step' (prepare, train, predict, evaluate, all)" >&2; exit 2 ;;
esac
