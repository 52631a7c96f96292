"""What the calibrate-folder tests share: tiny nnU-Net folders (labels and regions, two members, built once for the
package) and the arguments of a fit on fold 0."""
from __future__ import annotations

import pytest

from tests.conftest import require

NNUNET_FILES = "nnU-Net's export code makes the real nnU-Net files (README, 'nnU-Net and MONAI prediction folders')"
FAST = ["--bootstrap-samples", "0", "--no-failure-detection", "--no-figures"]


@pytest.fixture(scope="package")
def nn(tmp_path_factory):
    require("nnunetv2", NNUNET_FILES)
    from tests.tool_outputs import make_nnunet

    root = tmp_path_factory.mktemp("cal")
    # over-confident: large logits, heavy noise
    return {"labels": make_nnunet(root / "labels", dims=3, noise=4.0, members=2),
            "regions": make_nnunet(root / "regions", dims=3, regions=True, noise=4.0, members=2)}


def fit_fold_0(folders: dict, out, *extra: str) -> list[str]:
    """mcseg-calibrate-folder's arguments: fit on member 0's fold-0 validation cases, apply to member 1's folder
    (every case, the fit cases too), write to ``out``."""
    val, test = folders["members"]
    return ["--fit", str(val), "--reference", str(folders["raw"]), "--apply", str(test), "-o", str(out),
            "--splits", str(folders["splits"]), "--fold", "0", "--allow-fit-cases", *extra]
