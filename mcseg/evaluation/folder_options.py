"""Command-line options shared by the folder commands that fit on saved validation predictions and apply to a test
folder (``mcseg-calibrate-folder``, ``mcseg-conformal-folder``, scripts/conformal_validity.py): how the folders and
their reference are read, as ``mcseg-evaluate-folder`` reads them, and the fit / apply / output folders; and
``--workers``, which every folder command has (:mod:`mcseg.evaluation.case_pool`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from mcseg.evaluation.formats import format_names

__all__ = ["add_fit_apply_options", "add_input_options", "add_workers_option"]


def add_input_options(p: argparse.ArgumentParser, fold_use: str = "take") -> None:
    """``--splits/--fold`` (``fold_use``: what the command does with the fold's validation cases), ``--format``,
    ``--monai-postfix`` and how the classes are named (``--dataset-json``, ``--num-classes``, ``--class-names``)."""
    p.add_argument("--splits", type=Path, help=f"nnU-Net's splits_final.json: {fold_use} the validation cases of --fold")
    p.add_argument("--fold", help="a fold of --splits, or 'all'")
    p.add_argument("--format", dest="fmt", default="auto", choices=("auto", *format_names()))
    p.add_argument("--monai-postfix", default="trans", help="SaveImage's output_postfix (default: trans)")
    p.add_argument("--dataset-json", type=Path, help="the dataset.json that gives the classes (default: the "
                   "reference's, or beside/above its labels)")
    p.add_argument("--num-classes", type=int, help="number of classes K of the task, background included, when "
                   "nothing else says")
    p.add_argument("--class-names", nargs="+", help="K class names, background first, when nothing else says")


def add_fit_apply_options(p: argparse.ArgumentParser, *, fit: str, reference: str, apply: str, output: str,
                          overwrite: str) -> None:
    """``--fit VAL_DIR ...``, ``--reference``, ``--apply TEST_DIR``, ``-o OUT_DIR`` and ``--overwrite``, with each
    command's own help."""
    p.add_argument("--fit", nargs="+", type=Path, required=True, metavar="VAL_DIR", help=fit)
    p.add_argument("--reference", type=Path, required=True, help=reference)
    p.add_argument("--apply", type=Path, metavar="TEST_DIR", help=apply)
    p.add_argument("-o", "--output-dir", type=Path, required=True, help=output)
    p.add_argument("--overwrite", action="store_true", help=overwrite)


def add_workers_option(p: argparse.ArgumentParser, work: str) -> None:
    """``--workers N``: the processes that do ``work`` (each case's part, :func:`mcseg.evaluation.case_pool.map_cases`);
    the outputs are those of one process. Checked by :func:`~mcseg.evaluation.case_pool.check_workers` before anything
    is read or written."""
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help=f"processes that {work} (default 1); the outputs are the same as with one")
