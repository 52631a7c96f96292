"""Splits by patient, stratified, with an official test set; other datasets keep the plain split."""
from __future__ import annotations

from collections import Counter

import pytest
from .data_helpers import build, fake_download
from hypothesis import given, settings
from hypothesis import strategies as st

from mcseg.data.split import SplitInfo, make_dataset_split, make_grouped_split, make_split


def acdc_like(n_patients=100, n_test=50):
    ids, groups, strata, test = [], {}, {}, []
    for p in range(1, n_patients + n_test + 1):
        for frame in ("ED", "ES"):
            case = f"patient{p:03d}_{frame}"
            ids.append(case)
            groups[case] = f"patient{p:03d}"
            strata[case] = ("NOR", "MINF", "DCM", "HCM", "RV")[(p - 1) // 20 % 5] if p <= n_patients else "x"
            if p > n_patients:
                test.append(case)
    return ids, SplitInfo(test=test, groups=groups, strata=strata)


def test_acdc_official_split_validation_by_patient_and_group():
    ids, info = acdc_like()
    split = make_grouped_split(ids, 0.2, 0.3, seed=0, info=info)
    assert split["test"] == sorted(info.test)  # the 50 testing/ patients, test_fraction unused
    assert len(split["val"]) == 40 and len(split["train"]) == 160
    for part in ("train", "val", "test"):
        patients = Counter(info.groups[c] for c in split[part])
        assert set(patients.values()) == {2}  # both frames of a patient, always together
    assert Counter(info.strata[c] for c in split["val"]) == {g: 8 for g in ("NOR", "MINF", "DCM", "HCM", "RV")}
    assert split == make_grouped_split(ids, 0.2, 0.3, seed=0, info=info)
    assert split["val"] != make_grouped_split(ids, 0.2, 0.3, seed=1, info=info)["val"]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(6, 60), frames=st.integers(1, 3), n_strata=st.integers(1, 4), seed=st.integers(0, 99),
       val=st.sampled_from([0.1, 0.2, 0.3]), test=st.sampled_from([0.0, 0.15, 0.3]))
def test_grouped_split_never_separates_a_group(n, frames, n_strata, seed, val, test):
    ids = [f"p{p:02d}_{f}" for p in range(n) for f in range(frames)]
    info = SplitInfo(groups={c: c.split("_")[0] for c in ids}, strata={c: str(int(c[1:3]) % n_strata) for c in ids})
    split = make_grouped_split(ids, val, test, seed, info)
    assert sorted(split["train"] + split["val"] + split["test"]) == sorted(ids)
    owner = {}
    for part, cases in split.items():
        for c in cases:
            assert owner.setdefault(info.groups[c], part) == part
    assert len({info.groups[c] for c in split["val"]}) == max(1, round(n * val))
    assert split["train"]


def test_datasets_without_constraints_keep_the_plain_split(make_cfg, tmp_path):
    root, overrides = fake_download("nnunet", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    ids = [r.case_id for r in dataset.case_refs()]
    assert dataset.split_info() is None
    assert make_dataset_split(dataset, ids, 0.2, 0.2, 5) == make_split(ids, 0.2, 0.2, 5)


def test_acdc_dataset_split_end_to_end(make_cfg, tmp_path):
    root, overrides = fake_download("acdc", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    ids = [r.case_id for r in dataset.case_refs()]
    split = make_dataset_split(dataset, ids, 0.2, 0.2, 0)
    assert split["test"] == [f"patient{p}_{f}" for p in (101, 102, 103, 104) for f in ("ED", "ES")]
    assert len(split["val"]) == 4 and {c[:10] for c in split["val"]} <= {c[:10] for c in ids if c < "patient100"}
    off, _ = build(make_cfg, overrides + ["dataset.official_split=false"])
    split = make_dataset_split(off, ids, 0.2, 0.2, 0)
    assert any(c >= "patient100" for c in split["train"])
    assert not {c[:10] for c in split["train"]} & {c[:10] for c in split["test"]}


def test_fixed_test_cases_must_exist():
    with pytest.raises(ValueError, match="absent from the dataset"):
        make_grouped_split(["a", "b", "c"], 0.3, 0.0, 0, SplitInfo(test=["z"]))
