"""GPU and cluster behaviour, proved on the CPU: an accelerator is simulated by the ``meta``
device (tensors that live "elsewhere" and cannot be read back) or by monkeypatched
``torch.cuda`` functions, so these tests fail on a CPU-only machine exactly where the real
device would."""
from __future__ import annotations

import pytest
import torch

from mcseg.engine import checkpoint
from mcseg.engine.trainer import Trainer
from mcseg.train import train

from .conftest import TINY_2D


class _Stop(Exception):
    pass


def test_resume_on_an_accelerator_keeps_rng_states_and_step_counters_on_the_host(make_cfg, monkeypatch):
    """The checkpoint is read on the CPU: the RNG states reach ``torch.set_rng_state`` as CPU
    tensors, and Adam's step counters stay where a fresh non-capturable Adam keeps them (the
    host), while its moments follow the parameters onto the device."""
    overrides = TINY_2D + ["trainer.max_epochs=1", "dataset.sampling.samples_per_epoch=4"]
    train(make_cfg(overrides))
    saved = checkpoint.load_checkpoint(make_cfg(overrides).paths.output_dir + "/checkpoints/last.pt")
    original = Trainer.resume
    seen = {}

    def on_device(self, path):
        torch.__future__.set_swap_module_params_on_conversion(True)  # the optimiser keeps its parameters
        try:
            self.model.to("meta")  # stands for the accelerator
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
        self.device = torch.device("meta")
        original(self, path)
        seen["state"] = self.optimizer.state
        raise _Stop

    monkeypatch.setattr(Trainer, "resume", on_device)
    with pytest.raises(_Stop):
        train(make_cfg(overrides + ["trainer.resume=true"]))
    state = seen["state"]
    assert state and all(s["step"].device.type == "cpu" for s in state.values())
    assert all(s["exp_avg"].device.type == "meta" for s in state.values())
    assert torch.equal(torch.get_rng_state(), saved["rng"]["torch"])


@pytest.fixture
def fake_cuda(monkeypatch):
    """``torch.cuda`` with ``visible`` GPUs; ``current`` is the process's device. Setting the state
    of a device that is not visible raises IndexError, as torch does."""
    gpus = {"visible": 1, "current": 0, "set": {}}

    def check(index):
        if not 0 <= index < gpus["visible"]:
            raise IndexError(f"device {index} of {gpus['visible']}")
        return index

    def index_of(device):
        return gpus["current"] if device in ("cuda", None) else torch.device(device).index

    def set_rng_state(state, device="cuda"):
        gpus["set"][check(index_of(device))] = state.clone()

    def set_rng_state_all(states):
        for i, state in enumerate(states):
            set_rng_state(state, f"cuda:{i}")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus["visible"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: gpus["current"])
    monkeypatch.setattr(torch.cuda, "get_rng_state",
                        lambda device="cuda": torch.full((16,), check(index_of(device)), dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all",
                        lambda: [torch.full((16,), i, dtype=torch.uint8) for i in range(gpus["visible"])])
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_rng_state_all)
    return gpus


def test_rng_states_of_a_4_gpu_run_restore_on_1_gpu(fake_cuda):
    fake_cuda.update(visible=4, current=2)  # saved by the process of cuda:2 on a 4-GPU node
    states = checkpoint.rng_states()
    fake_cuda.update(visible=1, current=0, set={})
    checkpoint.restore_rng_states(states)
    assert set(fake_cuda["set"]) == {0}
    assert torch.equal(fake_cuda["set"][0], torch.full((16,), 2, dtype=torch.uint8))  # the saving device's stream


def test_rng_states_of_an_older_checkpoint_with_every_gpu_restore_the_current_one(fake_cuda):
    states = checkpoint.rng_states()
    states.pop("cuda_device", None)
    states["cuda"] = [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]  # the former format: every GPU
    fake_cuda.update(visible=2, current=1)
    checkpoint.restore_rng_states(states)
    assert set(fake_cuda["set"]) == {1} and torch.equal(fake_cuda["set"][1], states["cuda"][1])
