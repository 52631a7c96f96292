"""``trainer.deterministic=true``: the same numbers whatever else the machine runs (docs/reliability.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mcseg import runtime
from mcseg.inference.build import load_checkpoint
from mcseg.runtime import AdaptiveThreads
from mcseg.train import train

from .conftest import ROOT, TINY_2D, torch_threads

EXACT = TINY_2D + ["trainer.deterministic=true", "trainer.max_epochs=2", "dataset.sampling.samples_per_epoch=8",
                   "posthoc.fit=[]", "posthoc.apply=[]"]
FIGURES = ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece", "mean_nll")


class Contended:
    """Scheduler statistics of a machine whose cores another process holds half of the time: every
    :meth:`AdaptiveThreads.tick` sees one second pass in which each thread waited half of it."""

    def __init__(self) -> None:
        self.now, self.waited = 0.0, 0

    def clock(self) -> float:
        self.now += 1.0
        self.waited += int(0.5e9)
        return self.now

    def waits(self) -> dict[int, int]:
        return {1: self.waited, 2: self.waited}


def _run(make_cfg, out: Path, governor: AdaptiveThreads | None, monkeypatch, extra=()) -> tuple[dict, dict]:
    monkeypatch.setattr(runtime, "_PROCESS_THREADS", governor)
    train(make_cfg(EXACT + list(extra), output_dir=out))
    summary = json.loads((out / "eval/test/summary.json").read_text())
    return load_checkpoint(out / "checkpoints/last.pt")["model"], summary


def _differences(a: tuple[dict, dict], b: tuple[dict, dict]) -> list[str]:
    (wa, sa), (wb, sb) = a, b
    return ([k for k in wa if not torch.equal(wa[k], wb[k])]
            + [k for k in FIGURES if sa.get(k) != sb.get(k)])


@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory):
    """One deterministic tiny run with two torch threads on a quiet machine (no governor)."""
    out = tmp_path_factory.mktemp("quiet") / "run"
    with torch_threads(2), pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime, "_PROCESS_THREADS", None)
        mp.setenv("MCSEG_ADAPTIVE_THREADS", "0")
        from tests.conftest import compose_config

        train(compose_config("train", EXACT, out))
    return load_checkpoint(out / "checkpoints/last.pt")["model"], json.loads((out / "eval/test/summary.json").read_text())


@pytest.mark.slow
def test_a_deterministic_run_on_a_busy_machine_keeps_its_threads_and_its_numbers(make_cfg, tmp_path, monkeypatch,
                                                                                   quiet_run):
    """The defect of issue #21: AdaptiveThreads lowered torch's threads mid-run on a shared CPU and the
    reduction order (so weights and figures) changed; a deterministic run must not let it."""
    with torch_threads(2):
        contended = Contended()
        governor = AdaptiveThreads("cpu", clock=contended.clock, waits=contended.waits, backoff_s=3.0)
        assert governor.enabled
        busy = _run(make_cfg, tmp_path / "busy", governor, monkeypatch)
        threads_after = torch.get_num_threads()
    assert _differences(quiet_run, busy) == []
    assert governor.reductions == 0 and threads_after == 2, "a deterministic run changed torch's thread count"
    assert governor.contention_warned  # and the user was told why it runs slowly, and what to do


def test_without_determinism_a_busy_machine_still_sheds_threads(make_cfg, tmp_path, monkeypatch):
    """The speed under load of ordinary runs stays: the governor drops to one thread there."""
    with torch_threads(2):
        contended = Contended()
        governor = AdaptiveThreads("cpu", clock=contended.clock, waits=contended.waits, backoff_s=3.0)
        _run(make_cfg, tmp_path / "busy", governor, monkeypatch, ["trainer.deterministic=false"])
    assert governor.reductions > 0
    recorded = json.loads((tmp_path / "busy/result.json").read_text())["environment"]
    assert recorded["cpu_threads"] == 2 and recorded["cpu_threads_lowered"] == governor.reductions
    assert recorded["deterministic"] is False


def test_every_record_names_the_code_libraries_device_and_threads(quiet_run, tmp_path_factory):
    import subprocess

    from mcseg import environment

    run = next(Path(tmp_path_factory.getbasetemp()).glob("quiet*/run"))
    records = {
        "checkpoint": load_checkpoint(run / "checkpoints/best.pt")["environment"],
        "result.json": json.loads((run / "result.json").read_text())["environment"],
        "summary.json": json.loads((run / "eval/test/summary.json").read_text())["provenance"]["environment"],
        "provenance.json": json.loads((run / "eval/test/provenance.json").read_text())["environment"],
    }
    head = subprocess.run(["git", "-C", str(environment.PACKAGE_DIR), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    for where, record in records.items():
        assert record["code"]["mcseg"] == environment._version("mcseg") != "unknown", where
        if head.returncode == 0:  # tests run from a checkout (CI's clone is one)
            assert record["code"]["git_commit"] == head.stdout.strip() and isinstance(record["code"]["git_dirty"], bool)
        assert record["libraries"]["torch"] == str(torch.__version__) and record["libraries"]["monai"]
        assert set(record["libraries"]) == {"python", "torch", "monai", "numpy", "hydra"}
        assert record["device_type"] == "cpu" and record["device_name"]
        assert record["cpu_threads"] == 2 and record["cpu_threads_lowered"] == 0 and record["deterministic"] is True


def test_outside_a_checkout_the_commit_is_unknown(tmp_path, monkeypatch):
    from mcseg import environment

    monkeypatch.setattr(environment, "PACKAGE_DIR", tmp_path)
    environment.code_version.cache_clear()
    try:
        assert environment.code_version()["git_commit"] == "unknown"
        assert environment.code_version()["git_dirty"] == "unknown"
    finally:
        environment.code_version.cache_clear()


def test_seeding_without_determinism_leaves_torch_inductor_unimported_and_turns_an_earlier_setting_off():
    """torch.use_deterministic_algorithms imports torch._inductor (1-2 s of every training's start, #58): a run
    without determinism does not call it unless an earlier run of the process turned determinism on."""
    script = ("import sys, torch\n"
              "from mcseg.runtime import seed_everything\n"
              "seed_everything(0, False)\n"
              "assert 'torch._inductor' not in sys.modules, 'imported torch._inductor'\n"
              "assert not torch.are_deterministic_algorithms_enabled()\n"
              "seed_everything(0, True)\n"
              "assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()\n"
              "import torch._inductor.config as c\n"
              "assert c.deterministic\n"
              "seed_everything(0, False)\n"
              "assert not torch.are_deterministic_algorithms_enabled() and not c.deterministic\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
