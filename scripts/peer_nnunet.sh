#!/usr/bin/env bash
# nnU-Net v2 beside mcseg: the same hippocampus split, the same wall-clock training budget, both scored
# by mcseg's evaluator (issue #15). Optional; never run by CI or the tests.
#
#   bash scripts/peer_nnunet.sh RUN_DIR [BUDGET_MINUTES]
#
# RUN_DIR: a finished mcseg run on MSD hippocampus (e.g. of `python train.py experiment=hippocampus_cpu`).
#   Its split.json decides nnU-Net's training, validation and test cases; its eval/test/summary.json
#   and status.json (wall time) are the mcseg side.
# BUDGET_MINUTES: nnU-Net's training wall-clock (default: the run's own wall time, which also
#   covered mcseg's validations and test evaluation; nnU-Net's planning, preprocessing, final
#   validation and test prediction are timed separately and not charged to it).
# Environment: MCSEG_HIPPOCAMPUS_ROOT (default ../shared/data/hippocampus), PEER_WORK (default
#   outputs/peer_nnunet), PEER_VENV (default .venv-nnunet), nnUNet_n_proc_DA (default: the cores).
#
# nnU-Net runs as shipped (nnUNetTrainer, 3d_fullres plan, mirroring at test time) on the CPU, except
# that scripts/nnunet_budget_trainer.py stops it at the budget with the poly schedule stretched to end
# there. It is installed into its own venv by scripts/nnunet_venv.sh.
# Cost measured on the 2-core machine: docs/benchmarks.md, "nnU-Net v2 side by side".
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash scripts/peer_nnunet.sh RUN_DIR [BUDGET_MINUTES]" >&2; exit 2; }
run=$(cd "$1" && pwd)
[ -f "$run/eval/test/summary.json" ] || { echo "$run: no eval/test/summary.json: RUN_DIR must be a finished mcseg run" >&2; exit 2; }
data=${MCSEG_HIPPOCAMPUS_ROOT:-../shared/data/hippocampus}
work=$(mkdir -p "${PEER_WORK:-outputs/peer_nnunet}" && cd "${PEER_WORK:-outputs/peer_nnunet}" && pwd)
venv=${PEER_VENV:-.venv-nnunet}
mcseg_py=.venv/bin/python
id=904  # a dataset id of its own: a user's nnU-Net folders may already hold Dataset004
if [ $# -ge 2 ]; then
    budget_s=$(python3 -c "print(int(float('$2') * 60))")
else
    budget_s=$(python3 -c "import json; print(int(json.load(open('$run/status.json'))['wall_time_s']))")
fi

source scripts/nnunet_venv.sh
nnunet_venv "$venv" "$work"
export MCSEG_PEER_BUDGET_S=$budget_s
now() { date +%s.%N; }
minutes() { python3 -c "print(round(($2 - $1) / 60, 2))"; }

"$mcseg_py" scripts/peer_nnunet.py convert "$run" "$data" "$work" $id
t0=$(now)
"$venv/bin/nnUNetv2_plan_and_preprocess" -d $id -c 3d_fullres -np "$(nproc)" --verify_dataset_integrity
"$mcseg_py" scripts/peer_nnunet.py splits "$run" "$nnUNet_preprocessed/Dataset${id}_Hippocampus"
t1=$(now)
# nnUNetv2_train ends with nnU-Net's validation of the fold (mirroring); the trainer times its training
"$venv/bin/nnUNetv2_train" $id 3d_fullres 0 -tr nnUNetTrainer_mcsegBudget -device cpu
t2=$(now)
fold=$nnUNet_results/Dataset${id}_Hippocampus/nnUNetTrainer_mcsegBudget__nnUNetPlans__3d_fullres/fold_0
rm -rf "$work/predictions"
"$venv/bin/nnUNetv2_predict" -i "$nnUNet_raw/Dataset${id}_Hippocampus/imagesTs" -o "$work/predictions" \
    -d $id -c 3d_fullres -f 0 -tr nnUNetTrainer_mcsegBudget -device cpu --save_probabilities -npp 1 -nps 1
t3=$(now)
"$mcseg_py" -m mcseg.evaluate_folder "$work/predictions" "$work/labelsTs" --format nnunet --overwrite -o "$work/eval"
"$mcseg_py" - "$run" "$fold" "$work/times.json" "$t0" "$t1" "$t2" "$t3" <<'EOF'
import json, sys
run, fold, out, (t0, t1, t2, t3) = *sys.argv[1:4], map(float, sys.argv[4:])
status = json.load(open(f"{run}/status.json"))
train_s = json.load(open(f"{fold}/mcseg_budget.json"))["train_s"]
json.dump({"mcseg": status["wall_time_s"] / 60, "nnunet_prepare": (t1 - t0) / 60, "nnunet_train": train_s / 60,
           "nnunet_startup_validate": (t2 - t1 - train_s) / 60, "nnunet_predict": (t3 - t2) / 60}, open(out, "w"), indent=1)
EOF
"$mcseg_py" scripts/peer_nnunet.py compare "$run" "$work/eval/summary.json" "$work/times.json" | tee "$work/comparison.md"
