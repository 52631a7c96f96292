"""GPU and cluster behaviour, proved on the CPU: an accelerator is simulated by the ``meta``
device (tensors that live "elsewhere" and cannot be read back) or by monkeypatched
``torch.cuda`` functions, so these tests fail on a CPU-only machine exactly where the real
device would."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcseg.inference.build import load_checkpoint
from mcseg.training import checkpoint
from mcseg.training.trainer import Trainer
from mcseg.train import train

from .conftest import TINY_2D


class _Stop(Exception):
    pass


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*meta parameter:UserWarning")  # copying into the stand-in device
def test_resume_on_an_accelerator_keeps_rng_states_and_step_counters_on_the_host(make_cfg, monkeypatch):
    """The checkpoint is read on the CPU: the RNG states reach ``torch.set_rng_state`` as CPU
    tensors, and Adam's step counters stay where a fresh non-capturable Adam keeps them (the
    host), while its moments follow the parameters onto the device. ``load_best`` reads on the
    host too and copies only the weights to the device."""
    overrides = TINY_2D + ["trainer.max_epochs=1", "dataset.sampling.samples_per_epoch=4"]
    train(make_cfg(overrides))
    run_dir = Path(make_cfg(overrides).paths.output_dir)
    (run_dir / "result.json").unlink()  # a run stopped before its test evaluation: resumable, not finished
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    original, load = Trainer.resume, torch.load
    seen = {"map_location": []}

    def on_device(self, path):
        torch.__future__.set_swap_module_params_on_conversion(True)  # the optimiser keeps its parameters
        try:
            self.model.to("meta")  # stands for the accelerator
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
        self.device = torch.device("meta")
        original(self, path)
        seen["state"] = self.optimizer.state
        self.load_best()  # the whole of best.pt (optimiser moments too) on the device would be 3x the weights
        raise _Stop

    def spy(*args, **kwargs):
        seen["map_location"].append(str(kwargs.get("map_location")))
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)

    monkeypatch.setattr(Trainer, "resume", on_device)
    with pytest.raises(_Stop):
        train(make_cfg(overrides + ["trainer.resume=true"]))
    state = seen["state"]
    assert state and all(s["step"].device.type == "cpu" for s in state.values())
    assert all(s["exp_avg"].device.type == "meta" for s in state.values())
    assert torch.equal(torch.get_rng_state(), saved["rng"]["torch"])
    assert len(seen["map_location"]) >= 2 and set(seen["map_location"]) == {"cpu"}  # last.pt, best.pt on the host


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


# ----------------------------------------------------------------- out of memory in sliding-window inference
ALLOCATION_FAILURES = {
    "torch": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)"),
    "cudnn": lambda: RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    "cublas": lambda: RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    "monai-gaussian-map": lambda: _monai_reraise(),
}


def _monai_reraise() -> RuntimeError:
    """What MONAI raises when building its Gaussian importance map runs out of memory."""
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        except Exception as e:
            raise RuntimeError("patch size (16, 16, 16), mode=gaussian ... Seems to be OOM.") from e
    except RuntimeError as exc:
        return exc


def _fail_first_window_call(monkeypatch, error, fail_on_call: int = 1, stitch=None):
    """Make call ``fail_on_call`` of sliding-window inference raise ``error``; record every call's
    keyword arguments and whether an exception was being handled while it ran."""
    import sys

    from mcseg.inference import volume as inference

    calls = []
    real = inference.sliding_window_inference

    def fake(inputs, *args, **kwargs):
        calls.append({**kwargs, "handling": sys.exc_info()[0]})
        if len(calls) == fail_on_call:
            raise error()
        if stitch is not None:
            return stitch(inputs, kwargs)
        return real(inputs, *args, **kwargs)

    monkeypatch.setattr(inference, "sliding_window_inference", fake)
    return calls


@pytest.mark.parametrize("error", ALLOCATION_FAILURES.values(), ids=ALLOCATION_FAILURES.keys())
def test_out_of_memory_retries_with_host_stitching_and_returns_logits_on_the_device(monkeypatch, error):
    from mcseg.inference import volume as inference

    calls = _fail_first_window_call(
        monkeypatch, error, stitch=lambda inputs, kw: torch.zeros(1, 2, *inputs.shape[2:], device=kw.get("device")))
    image = torch.zeros(1, 16, 16, 32, device="meta")  # stands for an accelerator: not the CPU
    cfg = inference.InferenceConfig(roi_size=[16, 16, 16])
    out = inference.predict_logits(torch.nn.Identity(), image, 3, 16, cfg)
    assert len(calls) == 2 and calls[1]["device"] == "cpu" and calls[1]["sw_device"] == image.device
    assert calls[1]["buffer_steps"] >= 1 and calls[1]["buffer_dim"] == 2  # MONAI's buffered path, longest axis
    assert calls[1]["handling"] is None  # retried after the except block: the failed attempt is released
    assert out.shape == (2, 16, 16, 32) and out.device == image.device  # where the caller's statistics live


def test_an_error_that_is_not_an_allocation_failure_is_not_retried(monkeypatch):
    from mcseg.inference import volume as inference

    calls = _fail_first_window_call(monkeypatch, lambda: RuntimeError("CUDNN_STATUS_BAD_PARAM"))
    cfg = inference.InferenceConfig(roi_size=[16, 16, 16])
    with pytest.raises(RuntimeError, match="BAD_PARAM"):
        inference.predict_logits(torch.nn.Identity(), torch.zeros(1, 16, 16, 16, device="meta"), 3, 16, cfg)
    assert len(calls) == 1


def test_a_multi_case_evaluation_where_one_case_falls_back_matches_one_without(make_cfg, monkeypatch):
    """Three cases, the second out of memory on its first attempt: the summary is the one of an
    evaluation without the failure (host stitching by MONAI's buffered path is the same blend), and
    every case's logits reach the loss hook and the evaluator on the predictor's device. (On the CPU
    the retry is allowed here by declaring the CPU an accelerator.)"""
    from mcseg.inference import volume as inference
    from mcseg.training.loader import load_cases
    from mcseg.data.build import build_dataset
    from mcseg.evaluation.evaluator import Evaluator
    from mcseg.config import EvalProtocol
    from mcseg.evaluation.cases import evaluate_cases
    from mcseg.inference.predict import SegmentationPredictor

    dataset = build_dataset(make_cfg(["dataset=synthetic3d", "dataset.n_cases=3", "dataset.shape=[24,24,20]"]).dataset)
    cases = load_cases(dataset, dataset.case_refs(), workers=1)
    torch.manual_seed(0)
    model = torch.nn.Conv3d(1, dataset.num_classes, 3, padding=1)
    cfg = inference.InferenceConfig(roi_size=[16, 16, 16], overlap=0.5, sw_batch_size=2)
    predictor = SegmentationPredictor(model, 3, 1, lambda z: z.softmax(1), False, cfg, None, "32", torch.device("cpu"))

    def evaluate():
        devices = []
        evaluator = Evaluator(dataset.num_classes, dataset.class_names, EvalProtocol())
        evaluate_cases(predictor, cases, evaluator, dataset.restore,
                       on_logits=lambda logits, label: devices.append(logits.device))
        assert devices == [predictor.device] * len(cases)
        return evaluator.summary()

    clean = evaluate()
    monkeypatch.setattr(inference, "host_stitching_helps", lambda device: True)
    calls = _fail_first_window_call(monkeypatch, ALLOCATION_FAILURES["torch"], fail_on_call=2)
    fallen_back = evaluate()
    assert [c.get("device") for c in calls] == [None, None, "cpu", None]
    for key in ("mean_foreground_dice", "mean_ece", "mean_classwise_ece"):
        assert fallen_back[key] == pytest.approx(clean[key], abs=1e-6), key


@pytest.mark.parametrize(("dims", "shape"), [(2, (1, 20, 28, 6)), (3, (1, 16, 16, 16))], ids=["2d-slices", "3d-window"])
def test_cudnn_autotuner_is_off_during_inference_and_restored_after(monkeypatch, dims, shape):
    """Validation volumes differ in shape; with ``cudnn.benchmark`` on each new shape is tuned anew."""
    from mcseg.inference import volume as inference

    seen = []

    class Spy(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.backends.cudnn.benchmark)
            return x

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    cfg = inference.InferenceConfig(roi_size=[16, 16, 16])
    inference.predict_logits(Spy(), torch.zeros(shape), dims, 4, cfg)
    assert seen and not any(seen)
    assert torch.backends.cudnn.benchmark is True


# ----------------------------------------------------------------- a failed rank stops the others
class _GoneStore:
    """The store of a process group whose host (rank 0's process) has exited."""

    def add(self, key, amount):
        raise RuntimeError("Connection reset by peer")

    check = set = get = add


@pytest.mark.parametrize("failure", ["reported", "rank-0-gone"])
def test_a_waiting_rank_stops_at_once_when_another_failed(monkeypatch, failure):
    import time

    from torch import distributed

    from mcseg.training import distributed as mdist

    store = distributed.HashStore() if failure == "reported" else _GoneStore()
    monkeypatch.setattr(distributed.distributed_c10d, "_get_default_store", lambda: store)
    rank0, rank1 = mdist.DistContext(0, 2), mdist.DistContext(1, 2)
    if failure == "reported":
        rank0.report_failure(ValueError("validation failed (simulated)"))
    start = time.monotonic()
    with pytest.raises(mdist.RankFailed, match="rank 0" if failure == "reported" else "unreachable"):
        rank1.barrier()  # rank 1 waits while rank 0 validates
    assert time.monotonic() - start < 5


def test_a_store_barrier_lets_every_rank_through_once_all_arrived(monkeypatch):
    import threading

    from torch import distributed

    from mcseg.training import distributed as mdist

    store = distributed.HashStore()
    monkeypatch.setattr(distributed.distributed_c10d, "_get_default_store", lambda: store)
    passed = []
    threads = [threading.Thread(target=lambda r=r: (mdist._store_barrier(store, 3, "b"), passed.append(r)))
               for r in range(2)]
    for t in threads:
        t.start()
    threads[0].join(0.5)
    assert passed == []  # two of three arrived: both wait
    mdist._store_barrier(store, 3, "b")
    for t in threads:
        t.join(5)
    assert sorted(passed) == [0, 1]


SUBMITIT_LIKE_JOB = """
import os, time
from mcseg.training.distributed import init_distributed, shutdown
ctx, _ = init_distributed("cpu")
try:
    if ctx.rank == 0:  # validating while rank 1 waits at the barrier, then failing
        time.sleep(1)
        if os.environ["MODE"] == "killed":
            os._exit(9)
        raise ValueError("validation failed (simulated)")
    ctx.barrier()
except BaseException as exc:
    ctx.report_failure(exc)
    raise
finally:
    shutdown(ctx)
"""


@pytest.mark.parametrize("mode", [pytest.param("raised", marks=pytest.mark.slow), "killed"])
def test_ranks_of_a_job_without_torchrun_stop_soon_after_rank_0_fails(tmp_path, mode):
    """Two processes started as submitit starts its tasks (no torchrun agent to end the others):
    rank 0 fails while rank 1 waits for it at a barrier, and rank 1 stops within seconds through
    mcseg's store barrier (RankFailed), whatever the backend. (gloo, here, would also notice a dead
    peer by itself; NCCL does not, and its barrier waited for the process group's timeout: two hours.)"""
    import os
    import socket
    import subprocess
    import sys
    import time

    from .conftest import ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "MODE": mode,
           "PYTHONPATH": str(ROOT)}
    env.pop("SUBMITIT_EXECUTOR", None)
    procs = [subprocess.Popen([sys.executable, "-c", SUBMITIT_LIKE_JOB], env={**env, "RANK": str(r), "LOCAL_RANK": "0"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    start = time.monotonic()
    try:
        _, err = procs[1].communicate(timeout=90)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[1].returncode != 0 and "RankFailed" in err, err[-2000:]
    assert time.monotonic() - start < 60


def test_every_source_compiles_without_warnings():
    """The GPU machine runs Python 3.12, where an invalid escape such as ``\\m`` in a docstring is a
    SyntaxWarning printed by every process that imports the module (first seen there, in
    mcseg/metrics/uncertainty.py); on older Pythons it is a DeprecationWarning. Either is an error here."""
    import warnings
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sources = [p for d in ("mcseg", "scripts", "hydra_plugins", "tests") for p in (root / d).rglob("*.py")]
    sources += [root / "train.py", root / "evaluate.py"]
    bad = []
    for path in sources:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                compile(path.read_text(), str(path), "exec")
            except (SyntaxError, SyntaxWarning, DeprecationWarning) as exc:
                bad.append(f"{path.relative_to(root)}: {exc}")
    assert not bad, bad
