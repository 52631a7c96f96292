#!/usr/bin/env bash
# Create .venv and install mcseg with its test tools. CPU machines get the CPU build of torch
# through constraints-cpu.txt; on a GPU machine, install your CUDA torch first and run with
# MCSEG_GPU=1 so the installed torch is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
constraints=(-c constraints-cpu.txt)
[ "${MCSEG_GPU:-0}" = "1" ] && constraints=()
.venv/bin/python -m pip install --quiet --disable-pip-version-check "${constraints[@]}" -e ".[test]"
