#!/usr/bin/env bash
# Create .venv and install mcseg with its test tools.
#
# CPU machines (default): the CPU build of torch, pinned by constraints-cpu.txt.
# GPU machines: MCSEG_GPU=1 keeps the CUDA torch you installed for $PYTHON (default python3; a
# system, conda or venv interpreter): .venv sees the site-packages that torch is in, below its own.
# Without one, MCSEG_TORCH_INDEX=<the PyTorch wheel index URL of your CUDA version> installs
# torch from that index into .venv. A GPU set-up ends with an error unless .venv's torch is a CUDA build.
# Offline: pip reads PIP_NO_INDEX=1 and PIP_FIND_LINKS=<folder of wheels> from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
gpu=${MCSEG_GPU:-0}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# Hydra loads every installed plugin: the Optuna sweeper plugin that mcseg used before its own
# (hydra_plugins/mcseg_optuna_sweeper) needs optuna < 3, so a .venv set up before is rid of it here.
.venv/bin/python -m pip uninstall --quiet --yes hydra-optuna-sweeper 2>/dev/null || true
# nnU-Net's export code for tests/test_nnunet_folders.py and kin, without torchvision: --no-deps, after
# `.[test]`, which holds what that code imports (scikit-image, pandas). Its other declared dependencies stay
# missing on purpose (scripts/nnunet-tests.txt says why; pip lists no conflict for a --no-deps install).
# Under CI=true (as CI services set it) a failed install ends the set-up: the tests would error.
nnunet_tests() {
    if "${pip[@]}" --no-deps -r scripts/nnunet-tests.txt; then
        return 0
    fi
    case "${CI:-}" in
        [Tt][Rr][Uu][Ee] | 1)
            echo "setup: error: nnU-Net's export code (scripts/nnunet-tests.txt) could not be installed; under" \
                "CI=$CI the tests that need it fail instead of skipping" >&2
            exit 1 ;;
    esac
    echo "setup: nnU-Net's export code (scripts/nnunet-tests.txt) not installed: the tests that need it are skipped"
}
# Headless Chromium for tests/test_report_browser.py (report.html in a real browser, driven by the test extra's
# Playwright through the browser's executable): a Chromium already there ($MCSEG_CHROMIUM or on the PATH), else
# Debian's chromium-headless-shell installed with apt-get (as root, or with sudo -n). MCSEG_BROWSER=0 leaves it
# out. Under CI=true a Chromium that cannot be installed ends the set-up: the tests would fail.
browser() {
    [ "${MCSEG_BROWSER:-1}" = "0" ] && return 0
    [ -n "${MCSEG_CHROMIUM:-}" ] && [ -x "$MCSEG_CHROMIUM" ] && return 0
    local name
    for name in chromium-headless-shell chromium chromium-browser google-chrome; do
        if command -v "$name" >/dev/null 2>&1 || [ -x "/usr/lib/chromium/$name" ]; then return 0; fi
    done
    local sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo -n)
    if command -v apt-get >/dev/null 2>&1 && ${sudo[@]+"${sudo[@]}"} apt-get update -qq >/dev/null &&
        ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell \
            >/dev/null; then
        echo "setup: installed chromium-headless-shell (tests/test_report_browser.py)"
        return 0
    fi
    case "${CI:-}" in
        [Tt][Rr][Uu][Ee] | 1)
            echo "setup: error: no Chromium, and chromium-headless-shell could not be installed with apt-get; under" \
                "CI=$CI the browser tests of report.html fail instead of skipping (MCSEG_CHROMIUM=<executable>)" >&2
            exit 1 ;;
    esac
    echo "setup: no Chromium (apt-get install chromium-headless-shell, or MCSEG_CHROMIUM=<executable>): the" \
        "browser tests of report.html are skipped"
}
if [ "$gpu" != "1" ]; then
    "${pip[@]}" -c constraints-cpu.txt -e ".[test]"
    nnunet_tests
    browser
    exit 0
fi
if [ -n "${MCSEG_TORCH_INDEX:-}" ]; then
    "${pip[@]}" --index-url "$MCSEG_TORCH_INDEX" torch
elif torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null); then
    # --system-site-packages would not do: from inside a venv or conda env it exposes the base
    # interpreter's packages, not the env's. A .pth file appends torch's folder to .venv's path,
    # after .venv's own packages, and pip then counts that torch as installed.
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$torch_dir" > "$site/mcseg_gpu_torch.pth"
    echo "setup: using torch from $torch_dir"
fi
"${pip[@]}" -e ".[test]"
nnunet_tests
browser
.venv/bin/python - <<'EOF'
import sys
import torch
if not torch.version.cuda:
    sys.exit(f"setup: .venv's torch {torch.__version__} is a CPU build: install a CUDA build of torch for "
             "$PYTHON first, or give MCSEG_TORCH_INDEX=<PyTorch index URL for your CUDA>, then rerun "
             "(a .venv made by a CPU set-up holds a CPU torch of its own: remove .venv first)")
usable = torch.cuda.is_available()
print(f"setup: torch {torch.__version__}, CUDA {torch.version.cuda}, GPU "
      + (torch.cuda.get_device_name(0) if usable else "NOT usable (check nvidia-smi and the driver)"))
EOF
