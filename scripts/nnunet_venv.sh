# Sourced by scripts/peer_nnunet.sh and scripts/nnunet_calibration.sh: nnU-Net v2 in a venv of its own
# and its folders under a work directory.
#
#   nnunet_venv VENV WORK
#
# Makes VENV if it has no nnUNetv2_train: torch pinned by constraints-cpu.txt (a CPU build, as in mcseg's
# venv); nnunetv2 2.8.1 and its network package; timm, which that package lists, without its
# torchvision (the plain U-Nets do not use it). Copies scripts/nnunet_budget_trainer.py into its
# nnunetv2 (nnU-Net finds trainers only inside its package), and exports nnUNet_raw,
# nnUNet_preprocessed and nnUNet_results under WORK, and nnUNet_n_proc_DA (default: the cores).
nnunet_venv() {
    local venv=$1 work=$2 package
    if [ ! -x "$venv/bin/nnUNetv2_train" ]; then
        python3 -m venv "$venv"
        local pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt)
        "${pip[@]}" torch
        "${pip[@]}" --no-deps nnunetv2==2.8.1 dynamic-network-architectures==0.4.4 timm==1.0.22
        "${pip[@]}" acvl-utils batchgenerators batchgeneratorsv2 tqdm scipy scikit-learn scikit-image SimpleITK threadpoolctl \
            pandas graphviz tifffile requests nibabel matplotlib seaborn imagecodecs yacs einops blosc2 pyyaml \
            huggingface_hub safetensors
    fi
    package=$("$venv/bin/python" -c 'import os, nnunetv2; print(os.path.dirname(nnunetv2.__file__))')
    # at the top of nnU-Net's trainer package: its trainer search imports the top-level modules first, and
    # reaching the variants would import timm's models, which need the torchvision this venv lacks
    cp scripts/nnunet_budget_trainer.py "$package/training/nnUNetTrainer/nnUNetTrainer_mcsegBudget.py"
    export nnUNet_raw=$work/nnUNet_raw nnUNet_preprocessed=$work/nnUNet_preprocessed nnUNet_results=$work/nnUNet_results
    export nnUNet_n_proc_DA=${nnUNet_n_proc_DA:-$(nproc)}
}
