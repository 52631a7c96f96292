"""The preprocessing cache: written once, reused, invalidated by settings or source changes, filled in parallel."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from .data_helpers import build, fake_download

import mcseg.data.base as base


def _count_preprocessing(monkeypatch) -> list:
    calls = []
    original = base.forward

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(base, "forward", counting)
    return calls


def test_cache_is_written_once_then_memory_mapped(make_cfg, tmp_path, monkeypatch):
    root, overrides = fake_download("acdc", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    ref = dataset.case_refs()[0]
    calls = _count_preprocessing(monkeypatch)
    first = dataset.load(ref)
    cache_dir = dataset.cache.dir
    assert cache_dir.parent == tmp_path / "cache" and not cache_dir.is_relative_to(root)
    files = sorted(p.name for p in cache_dir.iterdir())
    assert f"{ref.case_id}.json" in files and f"{ref.case_id}.image.npy" in files and "settings.json" in files
    assert not [f for f in files if f.startswith(".")]  # no temporary files left behind
    again, _ = build(make_cfg, overrides)  # a new run with the same settings
    second = again.load(ref)
    assert len(calls) == 1
    assert isinstance(second.image, np.memmap) and isinstance(second.label, np.memmap)
    np.testing.assert_array_equal(first.image, second.image)
    np.testing.assert_array_equal(first.label, second.label)
    assert second.meta["geometry"] == first.meta["geometry"]
    settings = json.loads((cache_dir / "settings.json").read_text())
    assert settings["preprocess"]["target_spacing"] == [1.25, 1.25, None]


def test_changed_settings_recache_and_unchanged_ones_reuse(make_cfg, tmp_path, monkeypatch):
    root, overrides = fake_download("flare", tmp_path)
    ref = build(make_cfg, overrides)[0].case_refs()[0]
    calls = _count_preprocessing(monkeypatch)
    dirs = set()
    for extra in ([], ["dataset.preprocess.target_spacing=[1.0,1.0,2.0]"], ["dataset.normalization.clip=[-100,200]"],
                  [], ["dataset.preprocess.workers=3", "dataset.sampling.batch_size=7"]):
        dataset, _ = build(make_cfg, overrides + extra)
        dataset.load(ref)
        dirs.add(dataset.cache.dir)
    assert len(calls) == 3 and len(dirs) == 3  # workers and sampling do not change the arrays


def test_an_edited_source_file_is_preprocessed_again(make_cfg, tmp_path, monkeypatch):
    root, overrides = fake_download("nnunet", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    ref = dataset.case_refs()[1]
    calls = _count_preprocessing(monkeypatch)
    dataset.load(ref)
    dataset.load(ref)
    assert len(calls) == 1
    stat = os.stat(ref.label_path)
    os.utime(ref.label_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    dataset.load(ref)
    assert len(calls) == 2


def test_cache_off_writes_nothing(make_cfg, tmp_path):
    root, overrides = fake_download("brats", tmp_path)
    dataset, _ = build(make_cfg, overrides + ["dataset.preprocess.cache=false"])
    case = dataset.load(dataset.case_refs()[0])
    assert dataset.cache is None and case.meta["geometry"] is not None
    assert not (tmp_path / "cache").exists()


def test_identity_preprocessing_reads_cases_as_before(make_cfg, tmp_path):
    from tests.fake_datasets import write_msd

    root = write_msd(tmp_path / "msd")
    dataset, _ = build(make_cfg, ["dataset=msd", f"dataset.root={root}"])
    case = dataset.load(dataset.case_refs()[0])
    assert dataset.cache is None and "geometry" not in case.meta and case.label.dtype == np.int64
    assert dataset.prepare(dataset.case_refs()) == 0 and not (tmp_path / "cache").exists()


def test_prepare_fills_the_cache_with_worker_processes(make_cfg, tmp_path, capsys):
    root, overrides = fake_download("brats", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    refs = dataset.case_refs()
    assert dataset.prepare(refs, workers=2) == len(refs)
    assert "preprocessing brats" in capsys.readouterr().err  # the progress bar
    assert all(dataset.cache.has(r.case_id, dataset.source_files(r)) for r in refs)
    assert dataset.prepare(refs, workers=2) == 0


def test_a_corrupt_case_fails_prepare_with_its_file_named(make_cfg, tmp_path):
    root, overrides = fake_download("mrbrains", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    ref = dataset.case_refs()[2]
    ref.image_paths[1].write_bytes(ref.image_paths[1].read_bytes()[:200])
    with pytest.raises(ValueError, match="T1_IR.nii: cannot read"):
        dataset.prepare(dataset.case_refs(), workers=1, progress=False)


def test_atomic_writes_leave_files_readable_like_any_other(tmp_path):
    """mkstemp creates 0600 files; results written through atomic_write follow the umask instead."""
    from pathlib import Path

    from mcseg import files

    target = Path(tmp_path) / "summary.json"
    files.atomic_write(target, lambda tmp: tmp.write_text("{}"))
    assert target.stat().st_mode & 0o777 == 0o666 & ~files._UMASK
    assert target.stat().st_mode & 0o044 or files._UMASK & 0o044  # readable by others unless the umask forbids it
    assert not [p for p in Path(tmp_path).iterdir() if p.name.startswith(".summary")]
