"""Issue #58 item 4: ``--workers N`` reads and scores a folder's cases in N processes; the outputs are those of one
process to the byte (per_case.csv, summary.json, the pooled reliability tables and figures, failure detection,
provenance), as each worker returns one case's part and the main process merges them in case order."""
from __future__ import annotations

import pytest

from mcseg.config import EvalProtocol
from mcseg.evaluate_folder import evaluate_folder, main
from tests.test_monai_folders import _labels
from tests.tool_outputs import make_monai


def written_bytes(out) -> dict[str, bytes]:
    """Every file a folder command wrote under ``out`` (by its path there), but status.json (times, the process)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "status.json"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("workers")
    labels = _labels(root / "labels", (11, 9, 6), n=4)
    return labels, make_monai(root / "pred", labels, noise=3.0)


# the figures are drawn from the merged sums the tables show; with them (slow: four PNGs) the PNGs are compared too
@pytest.mark.parametrize("figures", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_two_workers_write_the_bytes_of_one(folder, tmp_path, figures):
    labels, pred = folder
    protocol = EvalProtocol(bootstrap_samples=20, figures=figures)
    outs = {}
    for workers in (1, 2):
        out = tmp_path / str(workers) / "eval"  # the same folder name: the figures' titles carry it
        evaluate_folder(pred, labels, protocol=protocol, output_dir=out, workers=workers)
        outs[workers] = written_bytes(out)
    assert {"per_case.csv", "summary.json", "reliability.csv", "reliability_histogram.csv", "failure_per_case.csv",
            "provenance.json", *(("reliability.png", "reliability_histogram.png") if figures else ())} <= set(outs[1])
    assert outs[1].keys() == outs[2].keys()
    for name in outs[1]:
        assert outs[1][name] == outs[2][name], name


def test_a_bad_number_of_workers_is_refused_before_anything_is_written(folder, tmp_path, capsys):
    labels, pred = folder
    assert main([str(pred), str(labels), "-o", str(tmp_path / "out"), "--workers", "0"]) == 2
    assert "--workers=0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
