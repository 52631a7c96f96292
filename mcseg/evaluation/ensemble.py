"""``evaluate.py ckpt=[<a>,<b>,...]``: a deep ensemble of trained checkpoints, evaluated as one predictor.

* Members are checkpoints or run directories (their ``best.pt``); a directory that is not a run stands for
  every run under it with a ``best.pt`` (e.g. the seeds of one configuration of a sweep), which must then
  be runs of one configuration (``configuration_sha256`` of their ``result.json``).
* Members must agree on what they predict and from what: input channels, classes and their names,
  multi-label or not, the patch geometry (dimensionality, slice axis, patch size) and their split; when
  they recorded it, also the content of their data. Otherwise one line names the member and the difference.
* Members must differ in their weights (hashed: :func:`weights_sha256`): copies of one network (or runs of one
  configuration and seed) are refused; a member whose run has not finished training is warned of (:func:`finished`).
* Their softmax (sigmoid) **probabilities** are averaged (:class:`mcseg.inference.predict.EnsemblePredictor`),
  with each member's own TTA views and MC samples, one case and one member at a time: memory does not grow
  with the number of members.
* Post-hoc scalers (``posthoc.apply``) are fitted on the pooled prediction of the members' shared validation
  split and kept with the ensemble's evaluation (``posthoc.pool=before``), or each member's own fit (its
  run's ``calibration.json``) scales its logits before pooling (``posthoc.pool=after``; Rahaman & Thiery 2021
  compare both).
* Results go to ``<the members' common folder>/ensembles/ensemble<K>-<sha8 of the members' hashes>/<split>/``
  (or ``eval_dir=``), never into a member's ``eval/``; the provenance lists every member.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mcseg.calibration import PosthocConfig
from mcseg.config import EvalProtocol, InferenceConfig, typed
from mcseg.inference.build import build_predictor, load_checkpoint, restore_model
from mcseg.evaluation.checkpoint import (SELECTED, check_compatible, checkpoint_split, clear_evaluation, own_splits,
                                          refuse_fixed_overrides, resolve_checkpoint_path, reuses_clean)
from mcseg.evaluation.members import member_settings, member_tag, members_as_asked, mirrored_as_asked, pooled_after_tag
from mcseg.evaluation.predictor import Evaluation, Member, Outputs, evaluate_predictor, plan_members
from mcseg.data.build import build_dataset, record_dataset_facts
from mcseg.data.shift import check_modality, shift_config
from mcseg.inference.predict import EnsemblePredictor
from mcseg.evaluation.provenance import checkpoint_identity, file_sha256
from mcseg.environment import environment_record
from mcseg.errors import ConfigError
from mcseg.runtime import resolve_device

log = logging.getLogger(__name__)

# What members must share: (what, how it is read from a checkpoint)
AGREEMENT = {
    "input channels": lambda s: s["config"]["dataset"].get("in_channels"),
    "classes": lambda s: s["config"]["dataset"].get("num_classes"),
    "class names": lambda s: list(s["config"]["dataset"].get("class_names") or []),
    "multi-label outputs": lambda s: bool(s["config"]["dataset"].get("multilabel", False)),
    "geometry (dims, slice axis, patch size)": lambda s: (
        s["config"]["dataset"]["sampling"].get("dims"), s["config"]["dataset"]["sampling"].get("slice_axis", -1),
        list(s["config"]["dataset"]["sampling"].get("patch_size") or [])),
    "split": lambda s: {k: sorted(v) for k, v in (s.get("split") or {}).items()},
    "data content": lambda s: (s.get("dataset") or {}).get("content_sha256"),
}


def member_paths(entries) -> list[Path]:
    """Checkpoint files of ``ckpt=[...]``: files, run directories (their best.pt), or folders of runs."""
    from mcseg.rundir import find_run_dirs

    paths: list[Path] = []
    for entry in entries:
        path = Path(str(entry)).expanduser().resolve()
        if path.is_dir() and not (path / "checkpoints" / SELECTED).is_file() and not (path / SELECTED).is_file():
            runs = [d for d in find_run_dirs([path]) if (d / "checkpoints" / SELECTED).is_file()]
            if not runs:
                raise FileNotFoundError(f"ckpt: {path} holds neither checkpoints/{SELECTED} nor runs with one")
            configurations = {}
            for run in runs:
                result = run / "result.json"
                key = json.loads(result.read_text()).get("run", {}).get("configuration_sha256") \
                    if result.is_file() else None
                configurations.setdefault(key, []).append(run)
            if len(configurations) > 1:
                listed = "; ".join(f"{len(r)} run(s) like {r[0].name}" for r in configurations.values())
                raise ConfigError(f"ckpt: {path} holds runs of {len(configurations)} configurations ({listed}): "
                                  "an ensemble is of one configuration's runs; list the runs to pool")
            paths += [run / "checkpoints" / SELECTED for run in runs]
        else:
            paths.append(resolve_checkpoint_path(path))
    unique = list(dict.fromkeys(paths))
    if len(unique) != len(paths):
        raise ConfigError("ckpt: a member is listed twice: " + ", ".join(
            str(p) for p in dict.fromkeys(p for p in paths if paths.count(p) > 1)))
    return unique


def weights_sha256(model_state: dict) -> str:
    """A hash of a network's weights (names, dtypes, shapes and bytes of its state dict): two files of one
    network (another epoch counter, optimiser state or time) have the same one."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(model_state):
        tensor = model_state[name]
        if not torch.is_tensor(tensor):  # a module's extra state
            digest.update(f"{name}:{tensor!r}".encode())
            continue
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def finished(path: Path, state: dict, run_dir: Path | None) -> bool | None:
    """Whether the member's run finished training (its ``result.json``); warned of when not: the checkpoint it
    holds now is pooled, and another evaluation later may pool another. None: not in a run directory."""
    if run_dir is None:
        return None
    if (run_dir / "result.json").is_file():
        return True
    try:
        status = json.loads((run_dir / "status.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):  # absent or unreadable: the warning says less
        status = None
    log.warning("%s: its run has not finished training (no result.json%s): the checkpoint it holds now, epoch %s, "
                "is pooled", path, f"; status.json: {status}" if status else "", state.get("epoch"))
    return False


def _disagreement(first: dict, other: dict) -> str | None:
    for what, read in AGREEMENT.items():
        a, b = read(first), read(other)
        if what == "data content" and (a is None or b is None):
            continue  # a member of a version that recorded no content
        if a != b:
            return f"{what}: {b!r}, the first member {a!r}"
    return None


def ensemble_dir(cfg: DictConfig, members: list[dict]) -> Path:
    """``eval_dir``, else ``<common folder of the members' runs>/ensembles/ensemble<K>-<sha8>/<split>``, with
    ``-<members>`` (:func:`ensemble_tag`: TTA, MC dropout, pooled after scaling) when they are asked for."""
    key = hashlib.sha256("\n".join(sorted(m["sha256"] for m in members)).encode()).hexdigest()[:8]
    if cfg.get("eval_dir"):
        out = Path(cfg.eval_dir).expanduser().resolve()
    else:
        runs = [Path(m["path"]).parent.parent if Path(m["path"]).parent.name == "checkpoints"
                else Path(m["path"]).parent for m in members]
        common = Path(os.path.commonpath([str(r) for r in runs]))
        if common in runs:  # one run's checkpoints: the ensemble goes beside the run, not into it
            common = common.parent
        tag = ensemble_tag(cfg)
        out = common / "ensembles" / f"ensemble{len(members)}-{key}" / (str(cfg.split) + (f"-{tag}" if tag else ""))
    if (out / "summary.json").exists() and not cfg.get("overwrite") and cfg.get("shift") is None:
        raise FileExistsError(f"{out / 'summary.json'} exists (an earlier evaluation of these members): pass "
                              "overwrite=true to replace it, or eval_dir=<another folder>")
    return out


def ensemble_tag(cfg: DictConfig) -> str | None:
    """What evaluate.py asks of every network beyond one plain pass (``tta-flips``, ``mc8``; see
    :func:`mcseg.evaluation.members.member_tag`) and ``pool-after`` when each is scaled before pooling;
    None for the plain ensemble."""
    plain = InferenceConfig()
    asked = members_as_asked(cfg, plain)
    return pooled_after_tag(member_tag(asked) if member_settings(asked) != member_settings(plain) else None, cfg)


def evaluate_ensemble(cfg: DictConfig, entries, overrides: list[str] | None = None) -> dict:
    """Evaluate the ensemble of ``entries`` (module docstring); a single member is evaluated as itself."""
    from mcseg.evaluation.checkpoint import evaluate_checkpoint

    overrides = list(overrides or [])
    paths = member_paths(entries)
    if len(paths) == 1:
        log.warning("ckpt: an ensemble of one member is that checkpoint: evaluating %s alone", paths[0])
        return evaluate_checkpoint(cfg, paths[0], overrides)
    if cfg.get("dataset") is not None:
        raise ConfigError("evaluate: an ensemble is evaluated on its members' own split; dataset= is not supported")
    device = resolve_device(cfg.device)
    predictors, identities, first_state, first_cfg, split = [], [], None, None, None
    for path in paths:
        state = load_checkpoint(path)
        run_cfg = OmegaConf.create(state["config"])
        if first_state is None:
            first_state, first_cfg = state, run_cfg
            refuse_fixed_overrides(cfg, run_cfg, overrides)
            split = checkpoint_split(path, state, True)[0]
            if split is None:
                raise ValueError(f"{path} holds no split (written before checkpoints stored theirs): it cannot be "
                                 "an ensemble member")
        else:
            differs = _disagreement(first_state, state)
            if differs:
                raise ValueError(f"{path}: cannot join an ensemble with {paths[0]}: {differs}")
        model, loss_fn = restore_model(run_cfg, state, path, device)
        inference = members_as_asked(cfg, mirrored_as_asked(cfg, typed(run_cfg.inference, InferenceConfig,
                                                                         "inference")))
        predictors.append(build_predictor(run_cfg, model, loss_fn, device, inference, run_cfg.trainer.precision))
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
        identities.append({**checkpoint_identity(path, state, file_sha256(path)),
                           "run_dir": str(run_dir) if run_dir is not None else None,
                           "seed": state["config"].get("seed"), "weights_sha256": weights_sha256(state["model"]),
                           "finished": finished(path, state, run_dir)})
        state.pop("optimizer", None), state.pop("model", None)  # the ensemble keeps a member's model, not these
    copies = {}
    for path, member in zip(paths, identities):
        if member["weights_sha256"] in copies:
            raise ConfigError(f"ckpt: {copies[member['weights_sha256']]} and {path} hold identical weights (sha256 "
                              f"{member['weights_sha256'][:8]}): an ensemble of copies is the single network; pool "
                              "networks trained apart (other seeds)")
        copies[member["weights_sha256"]] = path
    dataset = build_dataset(first_cfg.dataset)
    record_dataset_facts(first_cfg, dataset)
    check_compatible(paths[0], first_cfg, dataset, predictors[0].multilabel)
    check_modality(shift_config(cfg.get("shift")), dataset)
    splits = own_splits(paths[0], dataset, split)
    ensemble = EnsemblePredictor(predictors)
    protocol = typed(cfg.evaluation, EvalProtocol, "evaluation")
    out_dir = ensemble_dir(cfg, identities)
    key = out_dir.parent.name
    identity = {"path": str(out_dir.parent), "sha256": hashlib.sha256(
        "\n".join(sorted(m["sha256"] for m in identities)).encode()).hexdigest(), "members": len(identities)}
    pool_after = typed(cfg.posthoc, PosthocConfig, "posthoc").pool == "after"
    # pooled before: one fit of the pooled validation prediction, kept with the ensemble; pooled after: each
    # member's own fit, as its run holds it (fitted there now if it has none), applied before pooling
    members = [Member(p, {k: m[k] for k in ("path", "sha256", "epoch", "best_epoch")},
                      Path(m["run_dir"]) if m["run_dir"] else out_dir.parent) for p, m in zip(predictors, identities)]
    pooled = Member(ensemble, identity, out_dir.parent)
    plans = plan_members(cfg, split, members, pooled, out_dir.parent, pool_after)
    shift = shift_config(cfg.get("shift"))
    reuse = reuses_clean(cfg, out_dir)  # a shift suite's level 0
    if (out_dir / "summary.json").exists() and not reuse:  # overwrite=true, and nothing refused it
        clear_evaluation(out_dir)
    pool = ("probabilities; post-hoc scalers: each member's own, applied before pooling" if pool_after
            else "probabilities (posthoc.pool=before)")
    evaluation = Evaluation(
        ensemble, members, pooled, dataset, splits[cfg.split], str(cfg.split), "checkpoint",
        [r.case_id for r in splits["all"]], out_dir, {"ensemble": key, "members": identities, "pool": pool},
        first_state, first_cfg, paths[0], split, dataset, str(cfg.split), overrides,
        environment_record(device, bool(first_cfg.trainer.get("deterministic", False))), identity["sha256"],
        f"ensemble of {len(identities)}", fit_extra={"members": [m["sha256"] for m in identities]},
        shift_extra={"checkpoint": identity})
    return evaluate_predictor(evaluation, plans, protocol, Outputs.of_evaluate(cfg), reuse, shift, pool_after)
