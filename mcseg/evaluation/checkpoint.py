"""Re-evaluate a saved checkpoint: on which split, where the results go, and what produced them.

* What the checkpoint fixes comes from its stored config: the model and loss, the patch
  geometry (``dataset.sampling``: dimensionality, slice axis, patch size), ``inference`` and the
  precision, also on another dataset. Overrides of any of these are refused, by name.
* The split is the checkpoint's own (case ids stored at training). A checkpoint of an older
  version without them uses the ``split.json`` of the run directory it sits in, with a warning.
* ``<run>`` is the checkpoint's run directory when the checkpoint is ``<run>/checkpoints/<file>``
  and ``<run>/split.json`` is its split. A checkpoint anywhere else, or copied into another
  run's directory, is evaluated only where ``eval_dir=`` says: nothing is written next to it.
* The run's selected checkpoint (the content of ``<run>/checkpoints/best.pt``) is evaluated into
  ``<run>/eval/<split>/``; any other checkpoint into ``<run>/eval/<stem>-<sha8>/<split>/``; on
  another dataset the last part is ``<dataset>-<split>``. An existing evaluation is replaced
  only with ``overwrite=true``.
* Post-hoc scalers are looked up in, or fitted into, ``calibration.json`` by the checkpoint's
  sha256 (:mod:`mcseg.calibration.posthoc`). A fit on record is never replaced: a refit
  (``posthoc.refit=true``) is saved with the evaluation it was made for, ``<eval dir>/calibration.json``.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mcseg.calibration import PosthocConfig
from mcseg.config import EvalProtocol, InferenceConfig, resume_mismatch, typed
from mcseg.data.base import SegmentationDataset
from mcseg.data.split import SPLITS, check_split_name
from mcseg.inference.build import build_predictor, load_checkpoint, restore_model
from mcseg.data.build import Splits, build_dataset, record_dataset_facts, resolve_split
from mcseg.evaluation.split import PROVENANCE_FILE, clear_evaluation
from mcseg.evaluation.members import member_settings, member_tag, members_as_asked, mirrored_as_asked
from mcseg.evaluation.predictor import Evaluation, Member, Outputs, evaluate_predictor, plan_members
from mcseg.evaluation.shift import SUMMARY_FILE as SHIFT_SUMMARY
from mcseg.data.shift import check_modality, shift_config
from mcseg.evaluation.provenance import checkpoint_identity, file_sha256
from mcseg.data.validate import validate_cases
from mcseg.errors import ConfigError
from mcseg.rundir import holds_checkpoint_run
from mcseg.environment import environment_record
from mcseg.runtime import deterministic_algorithms, resolve_device
from mcseg.targets import check_targets

log = logging.getLogger(__name__)

SELECTED = "best.pt"  # the checkpoint training selected; its evaluation is the run's official one
# Keys of the evaluation's own config; every other key of the checkpoint's stored config is fixed by it.
EVALUATION_KEYS = ("dataset", "evaluation", "posthoc", "conformal", "paths", "task_name", "hydra")
# Parts of a dataset node the checkpoint fixes even when the data come from another dataset.
FIXED_DATASET_KEYS = ("sampling",)


def resolve_checkpoint_path(path: Path) -> Path:
    """``path``, or the selected checkpoint of the run directory ``path``."""
    if not path.is_dir():
        return path
    for candidate in (path / "checkpoints" / SELECTED, path / SELECTED):
        if candidate.is_file():
            log.info("ckpt=%s is a directory: evaluating its selected checkpoint %s", path, candidate)
            return candidate
    raise FileNotFoundError(f"ckpt={path} is a directory without checkpoints/{SELECTED}: pass "
                            f"ckpt=<run>/checkpoints/<file>.pt, or runs={path} to evaluate every run under it")


def refuse_fixed_overrides(cfg: DictConfig, run_cfg: DictConfig, overrides: list[str]) -> None:
    """A ConfigError naming each key (and override) that sets what the checkpoint fixes."""
    keys = [k for k in cfg if k in run_cfg and k not in EVALUATION_KEYS]
    keys += [f"dataset.{k}" for k in FIXED_DATASET_KEYS
             if any(o.lstrip("+~").startswith(f"dataset.{k}") for o in overrides)]
    if not keys:
        return
    named = [next((o for o in overrides if o.lstrip("+~").split("=")[0].startswith(k)), k) for k in keys]
    raise ConfigError(f"evaluate: {', '.join(named)} set(s) what the checkpoint fixes (the model, loss, trainer, "
                      f"inference and dataset.sampling come from its stored config); remove it, or train a run "
                      f"with it")


def _same_split(a: dict, b: dict) -> bool:
    return all(sorted(a.get(name, [])) == sorted(b.get(name, [])) for name in SPLITS)


def checkpoint_split(ckpt: Path, state: dict, has_eval_dir: bool) -> tuple[dict | None, Path | None, str]:
    """(the checkpoint's split as case ids, its run directory or None, where the split came from).

    Refuses a checkpoint copied into another run's directory (a split.json that is not its
    split) unless ``eval_dir=`` takes its results elsewhere.
    """
    candidate = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    split_file = candidate / "split.json" if candidate is not None else None
    on_disk = json.loads(split_file.read_text()) if split_file is not None and split_file.is_file() else None
    stored = state.get("split")
    if stored is None:
        if on_disk is None:
            return None, None, "none"
        log.warning("%s was written before checkpoints stored their split: using %s", ckpt, split_file)
        return on_disk, candidate, str(split_file)
    if on_disk is None:
        return stored, None, "checkpoint"
    if _same_split(stored, on_disk):
        foreign = other_runs_config(ckpt, state, candidate)
        if foreign is None:
            return stored, candidate, "checkpoint"
        if not has_eval_dir:
            raise ValueError(f"{ckpt}: its configuration is not its run's ({foreign}): the checkpoint was not trained "
                             f"in {candidate}; pass eval_dir=<folder> to evaluate it elsewhere")
        return stored, None, "checkpoint"
    if not has_eval_dir:
        raise ValueError(f"{ckpt}: its split (stored at training) is not {split_file}: the checkpoint was not "
                         f"trained in {candidate}; pass eval_dir=<folder> to evaluate it on its own split elsewhere")
    return stored, None, "checkpoint"


def other_runs_config(ckpt: Path, state: dict, run_dir: Path) -> str | None:
    """Where a checkpoint's model, loss, optimiser, seed or data settings differ from those of the run whose
    ``checkpoints/`` it sits in (that run's best.pt, else last.pt), or None: a checkpoint copied there from
    another run with the same split is told apart by what it ran. The run's own best.pt is not compared."""
    own = [run_dir / "checkpoints" / name for name in (SELECTED, "last.pt")]
    reference = next((p for p in own if p.is_file() and p.resolve() != ckpt.resolve()), None)
    if reference is None or ckpt.resolve() == own[0].resolve():
        return None
    return resume_mismatch(state["config"], load_checkpoint(reference)["config"], ("the checkpoint", str(reference)))


def check_compatible(ckpt: Path, run_cfg: DictConfig, dataset: SegmentationDataset, multilabel: bool) -> None:
    """One line when the model's input channels or outputs differ from the dataset's (before any inference).

    ``multilabel``: whether the model predicts overlapping regions (its loss's link, what training checked
    against its data); the stored ``dataset.multilabel`` may be null (nnU-Net: read from dataset.json)."""
    trained = run_cfg.dataset

    def outputs(n, regions: bool) -> str:
        return f"{n} regions (multi-label, one sigmoid each)" if regions else f"{n} classes (softmax)"

    want = (trained.get("in_channels"), trained.get("num_classes"), bool(multilabel))
    have = (dataset.in_channels, dataset.num_classes, dataset.multilabel)
    if want != have:
        raise ValueError(f"{ckpt}: the model takes {want[0]} input channel(s) and predicts {outputs(*want[1:])}, "
                         f"but dataset {dataset.name} has {have[0]} channel(s) and {outputs(*have[1:])}: evaluate "
                         f"it on a dataset with the channels and outputs it was trained on")
    if list(trained.get("class_names") or []) != list(dataset.class_names):
        log.warning("%s: classes trained as %s are scored as %s of dataset %s", ckpt,
                    list(trained.get("class_names") or []), dataset.class_names, dataset.name)


def output_dir(cfg: DictConfig, ckpt: Path, sha256: str, run_dir: Path | None, selected: bool,
               other_dataset: str | None, variant: str | None = None) -> Path:
    """Where this evaluation goes (module docstring); refuses to replace an earlier one unless ``overwrite``,
    or, with a shift suite (``shift=``), reuses it as the clean level (:mod:`mcseg.evaluation.shift`).
    ``variant`` (other members than the run's, :func:`member_tag`) is added to the split's folder name.

    Clears nothing: the caller removes an earlier evaluation (:func:`~mcseg.evaluation.split.clear_evaluation`) once every other
    check that can refuse this one has passed."""
    if cfg.get("eval_dir"):
        out = Path(cfg.eval_dir).expanduser().resolve()
        if run_dir is not None and out == run_dir.resolve():
            raise ConfigError(f"config key 'eval_dir'={cfg.eval_dir} is the run directory of {ckpt}: an evaluation "
                              f"there would mix its files with the run's; pass a folder of its own "
                              f"(e.g. {run_dir / 'eval' / 'mine'})")
    elif run_dir is None:
        raise ConfigError(f"ckpt={ckpt} is not in a run directory of its own (<run>/checkpoints/<file> next to "
                          f"its <run>/split.json): pass eval_dir=<folder> to say where its evaluation goes")
    else:
        base = run_dir / "eval" if selected else run_dir / "eval" / f"{ckpt.stem}-{sha256[:8]}"
        out = base / ((f"{other_dataset}-{cfg.split}" if other_dataset else str(cfg.split))
                      + (f"-{variant}" if variant else ""))
    if (out / "summary.json").exists() and not cfg.get("overwrite") and cfg.get("shift") is None:
        raise FileExistsError(f"{out / 'summary.json'} exists (an earlier evaluation; {PROVENANCE_FILE} says of "
                              f"what): pass overwrite=true to replace it, or eval_dir=<another folder>")
    return out


def reuses_clean(cfg: DictConfig, out: Path) -> bool:
    """A shift suite on an existing evaluation without overwrite=true: that evaluation is its level 0."""
    return cfg.get("shift") is not None and (out / "summary.json").exists() and not cfg.get("overwrite")


def own_splits(ckpt: Path, dataset: SegmentationDataset, split: dict) -> Splits:
    """The checkpoint's split as case references of ``dataset``; one line if a case is missing."""
    by_id = {r.case_id: r for r in dataset.case_refs()}
    missing = [c for name in SPLITS for c in split[name] if c not in by_id]
    if missing:
        raise ValueError(f"{ckpt}: {len(missing)} case(s) of its split are not in dataset {dataset.name} "
                         f"(first: {missing[0]}): its dataset.root must hold the data it was trained on")
    return Splits({name: [by_id[c] for c in split[name]] for name in SPLITS})


def evaluate_checkpoint(cfg: DictConfig, ckpt_path: Path, overrides: list[str] | None = None,
                        log_figure: Callable[[str, object], None] | None = None) -> dict:
    """Evaluate ``ckpt_path`` (a file, or a run directory: its best.pt) as the module docstring says.

    ``cfg`` is an evaluate config (configs/evaluate.yaml); ``overrides`` the command line's, checked
    and recorded in the provenance; ``log_figure(tag, figure)`` gets the conformal pass's overlay figures.
    Returns the summary (with its ``provenance``).
    """
    check_split_name(cfg.split)
    return _evaluate_held(cfg, resolve_checkpoint_path(Path(ckpt_path).expanduser().resolve()), overrides,
                          log_figure)


@holds_checkpoint_run  # never writes into a run another process is training or evaluating
def _evaluate_held(cfg: DictConfig, ckpt: Path, overrides: list[str] | None,
                   log_figure: Callable[[str, object], None] | None = None) -> dict:
    """A checkpoint of a deterministic run is evaluated with torch's deterministic algorithms on, which also
    keeps the CPU thread count fixed (:class:`mcseg.runtime.AdaptiveThreads`): the same figures under load."""
    state = load_checkpoint(ckpt)
    deterministic = bool((state.get("config") or {}).get("trainer", {}).get("deterministic", False))
    with deterministic_algorithms(deterministic):
        return _evaluate_state(cfg, ckpt, state, overrides, deterministic, log_figure)


def _evaluate_state(cfg: DictConfig, ckpt: Path, state: dict, overrides: list[str] | None,
                    deterministic: bool, log_figure: Callable[[str, object], None] | None = None) -> dict:
    overrides = list(overrides or [])
    run_cfg = OmegaConf.create(state["config"])
    check_targets(run_cfg)  # a checkpoint's stored config is untrusted input: refused before anything is built
    refuse_fixed_overrides(cfg, run_cfg, overrides)
    split, run_dir, split_source = checkpoint_split(ckpt, state, bool(cfg.get("eval_dir")))
    sha = file_sha256(ckpt)
    best = run_dir / "checkpoints" / SELECTED if run_dir is not None else None
    selected = best is not None and best.is_file() and (best.resolve() == ckpt or file_sha256(best) == sha)
    checkpoint = {**checkpoint_identity(ckpt, state, sha), "selected": selected}

    other = cfg.get("dataset") is not None
    eval_cfg = OmegaConf.create(state["config"])  # the run's own config stays intact for calibration
    if other:  # the data of another dataset, seen through the geometry the model was trained with
        eval_cfg.dataset = OmegaConf.to_container(cfg.dataset)
        for key in FIXED_DATASET_KEYS:
            eval_cfg.dataset[key] = run_cfg.dataset.get(key)
    dataset = build_dataset(eval_cfg.dataset)
    record_dataset_facts(eval_cfg, dataset)
    if not other and split is None:
        raise ValueError(f"{ckpt} holds no split (written before checkpoints stored theirs) and sits in no run "
                         f"directory with a split.json: evaluate it inside its run, or on another dataset with dataset=")
    # everything that can be refused is, before the first file is written or replaced
    device = resolve_device(cfg.device)
    model, loss_fn = restore_model(run_cfg, state, ckpt, device)
    check_compatible(ckpt, run_cfg, dataset, bool(getattr(loss_fn, "multilabel", False)))
    shift = shift_config(cfg.get("shift"))
    check_modality(shift, dataset)
    trained_inference = typed(run_cfg.inference, InferenceConfig, "inference")
    inference = members_as_asked(cfg, mirrored_as_asked(cfg, trained_inference))
    variant = member_tag(inference) if member_settings(inference) != member_settings(trained_inference) else None
    protocol = typed(cfg.evaluation, EvalProtocol, "evaluation")
    predictor = build_predictor(eval_cfg, model, loss_fn, device, inference, run_cfg.trainer.precision)
    if not other:
        splits = own_splits(ckpt, dataset, split)
        stored, root = state.get("dataset") or {}, getattr(dataset, "root", None)
        if stored.get("root") and stored["root"] != str(root):
            log.warning("%s was trained on the data at %s; evaluating the same case ids at %s", ckpt,
                        stored["root"], root)
    pool_after = variant is not None and typed(cfg.posthoc, PosthocConfig, "posthoc").pool == "after"
    out_dir = output_dir(cfg, ckpt, sha, run_dir, selected, dataset.name if other else None,
                         f"{variant}-pool-after" if pool_after else variant)
    # other members than the run's: a post-hoc fit of its own, on the pooled prediction (posthoc.pool=before),
    # kept with this evaluation under the checkpoint's hash and the members; pooled after, the network's own fit,
    # on record with the run, applied to each member
    own_fit = variant is None or pool_after
    member = Member(predictor, checkpoint if own_fit else {**checkpoint, "sha256": f"{sha}+{variant}"},
                    (run_dir or out_dir) if own_fit else out_dir)
    # the scalers on record (LTS weights too) or where a new fit goes: refused here, not after clearing
    plans = plan_members(cfg, split, [member], member, out_dir, pool_after)
    if not other:
        validate_cases(dataset, splits[cfg.split], "scoring")  # the same header checks as training and mcseg-data
    reuse = reuses_clean(cfg, out_dir)
    if (out_dir / "summary.json").exists() and not reuse:  # overwrite=true, nothing refused it: the earlier one goes
        # without a run directory, out's calibration.json is the checkpoint's fit on record: kept
        clear_evaluation(out_dir, refits=run_dir is not None)
        if shift is not None and (out_dir / SHIFT_SUMMARY).exists():
            (out_dir / SHIFT_SUMMARY).unlink()
    if other:  # another dataset's split, made (or reused) beside its evaluation
        splits = resolve_split(dataset, eval_cfg.dataset, out_dir)
        split_source = str(out_dir / "split.json")
        validate_cases(dataset, splits[cfg.split], "scoring")
    evaluation = Evaluation(
        predictor, [member], member, dataset, splits[cfg.split], str(cfg.split), split_source,
        [r.case_id for r in splits["all"]], out_dir, {"checkpoint": checkpoint,
                                                       "run_dir": str(run_dir) if run_dir is not None else None},
        state, run_cfg, ckpt, split, None if other else dataset, None if other else str(cfg.split), overrides,
        environment_record(device, deterministic), sha, f"{ckpt.name}, sha256 {sha[:8]}", log_figure=log_figure)
    return evaluate_predictor(evaluation, plans, protocol, Outputs.of_evaluate(cfg), reuse, shift, pool_after)
