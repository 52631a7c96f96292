#!/usr/bin/env bash
# The margin-loss authors' own training loop beside `python train.py model=mbls_unet`: samples/s end to
# end on the same 2D hippocampus slices, interleaved in one run (issue #25). Optional; never run by CI
# or the tests.
#
#   bash scripts/peer_mbls.sh AUTHORS_CHECKOUT [STEPS] [REPEATS]
#
# AUTHORS_CHECKOUT: a checkout of github.com/Bala93/MarginLoss (measured at commit 5466662); it is run
#   from its own folder (tools/train_net.py with their configs/), never copied.
# STEPS: timed training steps per run (default 12, a multiple of WARMUP); REPEATS: authors/mcseg pairs,
#   run A/B, B/A, A/B, ... (default 2).
# Environment: MCSEG_HIPPOCAMPUS_ROOT (default ../shared/data/hippocampus), PEER_WORK (default
#   outputs/peer_mbls), PEER_VENV (default .venv-mbls), MCSEG_PY (default .venv/bin/python), BATCH (32,
#   the preset's), PATCH (64: the preset's 64 x 48 is not a multiple of the U-Net's 32), WARMUP (3 steps),
#   WORKERS (0: loader workers on both sides), SPLIT_FROM (an mcseg run directory: its split instead of
#   the preset's).
#
# Same on both sides: the slices (the training cases of the split, every slice across the preset's axis
# as mcseg loads and normalises it, centred in PATCH x PATCH, exported by scripts/peer_mbls.py into the
# layout of their calibrate/data/hcmps.py), the U-Net (mcseg's mbls_unet is theirs, docs/benchmarks.md),
# batch size, CE, Adam (lr 1e-3), the loader workers, one thread per process. Their loop runs their
# hippocampus recipe (scripts/train_hcmps.sh: data=hcmps model=unet loss=ce optim=adam scheduler=step)
# with device=cpu, log_period=1 (their per-iteration log lines time it) and one epoch capped at
# WARMUP + STEPS batches (their epoch is every training slice: scripts/peer_mbls.py
# capped_train_val_loader, a Hydra target around their own loaders). mcseg runs epochs of WARMUP steps
# (the first is the warm-up, each epoch's train/samples_per_s times its steps only). Neither validation
# (one case), checkpoints nor the test evaluation (mcseg: one case; theirs: none, see peer_mbls.py) is
# in the timed window. Their configs/scheduler/step.yaml passes verbose=True, which torch 2.13's StepLR
# no longer takes: dropped by the override ~scheduler.object.verbose (it only printed the learning rate).
#
# The authors' venv: their requirement.txt with torch pinned by constraints-cpu.txt (the CPU build of
# mcseg's venv, for their torch==1.11.0+cu113); left out: torchvision (their code imports it only for
# the image grids of train.disp, off; a stand-in module in PEER_WORK/stubs raises if it is ever
# called), typing_extensions==4.5.0 (older than that torch needs), certifi's local path and their own
# `-e` line (their checkout is put on PYTHONPATH instead); scikit-image 0.20.0 instead of 0.19.3 (no
# wheel of it for this Python; hcmps.py imports it and uses none of it); setuptools below 81 (wandb
# 0.13.10 imports pkg_resources); tqdm added (their engine imports it, requirement.txt omits it).
# numpy stays at their 1.23.5: their evaluator uses np.float. Figures: docs/benchmarks.md, "The
# margin-loss authors' U-Net".
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash scripts/peer_mbls.sh AUTHORS_CHECKOUT [STEPS] [REPEATS]" >&2; exit 2; }
authors=$(cd "$1" && pwd)
[ -f "$authors/tools/train_net.py" ] && [ -f "$authors/calibrate/data/hcmps.py" ] || {
    echo "$authors: not a checkout of the margin-loss code (no tools/train_net.py, calibrate/data/hcmps.py)" >&2; exit 2; }
steps=${2:-12}
repeats=${3:-2}
batch=${BATCH:-32} patch=${PATCH:-64} warmup=${WARMUP:-3} workers=${WORKERS:-0}
(( steps % warmup == 0 )) || { echo "STEPS ($steps) must be a multiple of WARMUP ($warmup): mcseg's epochs are WARMUP steps" >&2; exit 2; }
data=$(cd "${MCSEG_HIPPOCAMPUS_ROOT:-../shared/data/hippocampus}" && pwd)
work=$(mkdir -p "${PEER_WORK:-outputs/peer_mbls}" && cd "${PEER_WORK:-outputs/peer_mbls}" && pwd)
venv=${PEER_VENV:-.venv-mbls}
mcseg_py=${MCSEG_PY:-.venv/bin/python}
scripts=$(pwd)/scripts

if [ ! -f "$venv/.peer-mbls-ready" ]; then
    python3 -m venv "$venv"
    pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt)
    grep -v -E '^(-e |certifi|torch|torchvision|typing_extensions|scikit-image)' "$authors/requirement.txt" \
        > "$work/requirements-authors.txt"
    "${pip[@]}" torch
    "${pip[@]}" -r "$work/requirements-authors.txt" scikit-image==0.20.0 "setuptools>=77.0.3,<81" tqdm
    touch "$venv/.peer-mbls-ready"
fi
mkdir -p "$work/stubs/torchvision"
cat > "$work/stubs/torchvision/__init__.py" <<'EOF'
"""Stand-in for torchvision, not installed (scripts/peer_mbls.sh): the margin-loss code imports it for
calibrate/utils/torch_helper.grid_image only, the image grids of train.disp=True."""


class utils:
    @staticmethod
    def make_grid(*args, **kwargs):
        raise NotImplementedError("torchvision is not installed in this venv (scripts/peer_mbls.sh)")
EOF

"$mcseg_py" scripts/peer_mbls.py export "$work" "$data" "$patch" ${SPLIT_FROM:+--split-from "$SPLIT_FROM"}
"$venv/bin/python" scripts/peer_mbls.py h5 "$work"

export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
authors_cmd=(env PYTHONPATH="$authors:$work/stubs:$scripts" "$venv/bin/python" "$authors/tools/train_net.py"
    task=medseg data=hcmps model=unet model.num_inp_channels=1 model.num_classes=3 loss=ce optim=adam scheduler=step
    "~scheduler.object.verbose" device=cpu wandb.enable=False train.max_epoch=1 log_period=1
    data.data_root="$work/hcmps" data.batch_size="$batch"
    data.object.trainval._target_=peer_mbls.capped_train_val_loader +data.object.trainval.max_batches=$((warmup + steps))
    data.object.trainval.num_workers="$workers" data.object.test.num_workers="$workers")
mcseg_cmd=("$mcseg_py" train.py dataset=hippocampus dataset.root="$data" dataset.split.file="$work/split.json"
    model=mbls_unet loss=ce optim=adam dataset.sampling.patch_size="[$patch,$patch]" dataset.sampling.batch_size="$batch"
    dataset.sampling.samples_per_epoch=$((warmup * batch)) dataset.sampling.num_workers="$workers"
    trainer.max_epochs=$((1 + steps / warmup)) trainer.val_every=1000000 trainer.val_max_cases=1
    trainer.progress_bar=false logger=none posthoc.fit=[] posthoc.apply=[]
    evaluation.bootstrap_samples=20 evaluation.figures=false inference.save_predictions=false)

echo "machine: $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start (other work may be running:"
echo "  the rates below are of a shared machine); every process runs with OMP_NUM_THREADS=1"
echo "authors: ${authors_cmd[*]} hydra.run.dir=..."
echo "mcseg:   ${mcseg_cmd[*]} hydra.run.dir=..."
rm -rf "$work/runs"
mkdir -p "$work/runs"
for r in $(seq 1 "$repeats"); do
    # Pairs alternate which side runs first (A/B, B/A, ...), so that neither always runs on a machine just
    # left by the other (the quiet run of issue #33 found mcseg second and lower in each of three A/B pairs).
    sides="authors mcseg"; (( r % 2 == 0 )) && sides="mcseg authors"
    for side in $sides; do
        dir=$work/runs/$side-$r
        start=$(date +%s.%N)
        if [ "$side" = authors ]; then
            "${authors_cmd[@]}" hydra.run.dir="$dir" > "$work/runs/$side-$r.out" 2>&1
        else
            "${mcseg_cmd[@]}" hydra.run.dir="$dir" > "$work/runs/$side-$r.out" 2>&1
        fi || { echo "$side run $r failed; the end of $work/runs/$side-$r.out:" >&2; tail -20 "$work/runs/$side-$r.out" >&2; exit 1; }
        echo "$side-$r: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s wall (start-up, training, validation, test)"
    done
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
"$mcseg_py" scripts/peer_mbls.py rates "$work" "$batch" "$warmup" | tee "$work/rates.md"
