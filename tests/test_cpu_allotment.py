"""What a process may use and what the code claims, checked without an accelerator: the CPUs of its allotment (not
the node's), the torch floor pyproject.toml declares against the newest torch API the code calls, and the training
precisions the code implements (a setting that would silently do nothing is refused)."""
from __future__ import annotations

import pytest
import torch

from .conftest import TINY_2D

# ----------------------------------------------------------------- CPUs a process may use
CPU_ENV = ("SLURM_STEP_ID", "SLURM_CPUS_PER_TASK", "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE")


@pytest.mark.parametrize(
    ("mask", "env", "expected"),
    [
        (4, {}, 4),  # a cgroup cpuset (or SLURM binding) of 4 CPUs on a 128-CPU node
        (64, {"SLURM_STEP_ID": "0", "SLURM_CPUS_PER_TASK": "8"}, 8),  # an srun task SLURM did not bind
        (16, {"TORCHELASTIC_RUN_ID": "r", "LOCAL_WORLD_SIZE": "4"}, 4),  # torchrun: 4 processes share one mask
        (64, {"SLURM_STEP_ID": "0", "SLURM_CPUS_PER_TASK": "32", "TORCHELASTIC_RUN_ID": "r",
              "LOCAL_WORLD_SIZE": "4"}, 8),  # torchrun inside an srun task
        (2, {"TORCHELASTIC_RUN_ID": "r", "LOCAL_WORLD_SIZE": "4"}, 1),  # never none
        (8, {"LOCAL_WORLD_SIZE": "4"}, 8),  # a submitit task: its own mask, LOCAL_WORLD_SIZE set by mcseg
    ],
)
def test_available_cpus_are_the_process_allotment_not_the_node(monkeypatch, mask, env, expected):
    from mcseg.runtime import available_cpus

    monkeypatch.setattr("os.cpu_count", lambda: 128)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(mask)), raising=False)
    for key in CPU_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert available_cpus() == expected


def test_workers_threads_and_preprocessing_processes_follow_the_allotment(monkeypatch, tmp_path):
    from concurrent import futures

    from mcseg.data.synthetic import SyntheticDataset
    from mcseg.training.loader import default_workers, load_cases
    from mcseg.runtime import helper_processes

    monkeypatch.setattr("os.cpu_count", lambda: 128)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    for key in CPU_ENV:
        monkeypatch.delenv(key, raising=False)
    assert default_workers(torch.device("cuda")) == 3  # 4 allotted, one kept by the training step
    assert helper_processes() == 3
    pools = []
    monkeypatch.setattr("mcseg.training.loader.ThreadPoolExecutor",
                        lambda n: pools.append(n) or futures.ThreadPoolExecutor(n))
    dataset = SyntheticDataset(n_cases=3, shape=[16, 16])
    load_cases(dataset, dataset.case_refs())
    assert pools == [4]


def test_no_code_counts_the_node_s_cpus_itself():
    """One helper answers "how many CPUs": ``os.cpu_count()`` only as its fallback."""
    from pathlib import Path

    import mcseg

    package = Path(mcseg.__file__).parent
    users = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if "cpu_count(" in p.read_text())
    assert users == ["runtime.py"]


# ----------------------------------------------------------------- the declared torch floor
# The newest torch APIs mcseg calls, with the first release that has each.
NEWEST_TORCH_APIS = {
    "torch.nn.utils.get_total_norm": (2, 6),  # pytorch/pytorch#139662, merged 2024-11-07, after 2.5
    "torch.OutOfMemoryError": (2, 5),  # the device-agnostic error (was torch.cuda.OutOfMemoryError)
}


def test_declared_torch_floor_is_the_newest_api_used():
    import re
    from pathlib import Path

    import mcseg

    from .conftest import ROOT

    floor = re.search(r'"torch>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert floor, "pyproject.toml declares no torch>= floor"
    sources = "".join(p.read_text() for p in Path(mcseg.__file__).parent.rglob("*.py"))
    for api in NEWEST_TORCH_APIS:  # the table stays true: drop an API from it when the code drops it
        assert api in sources, api
    assert tuple(int(v) for v in floor.group(1).split(".")[:2]) == max(NEWEST_TORCH_APIS.values())


# ----------------------------------------------------------------- settings that would silently do nothing
@pytest.mark.parametrize("value", ["fp16", "16", "bf16-mixed", "float32"])
def test_a_precision_the_code_does_not_implement_is_refused(make_cfg, value):
    from mcseg.config import validate_train_config
    from mcseg.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer\.precision.*expected bf16 or 32"):
        validate_train_config(make_cfg(TINY_2D + [f"trainer.precision={value}"]))


@pytest.mark.parametrize("value", ["bf16", "32"])
def test_the_implemented_precisions_are_accepted(make_cfg, value):
    from mcseg.config import validate_train_config

    validate_train_config(make_cfg(TINY_2D + [f"trainer.precision={value}"]))
