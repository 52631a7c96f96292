"""mcseg's Optuna sweeper (hydra_plugins/mcseg_optuna_sweeper) and the job's side of a trial (mcseg/trials.py):
the search space from Hydra's grammar, what the study is told, pruning, resumed and shared studies."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.utils import instantiate
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState
from omegaconf import OmegaConf

from hydra_plugins.mcseg_optuna_sweeper.optuna_sweeper import (as_value, fail_orphans, grid_of, search_space,
                                                                tell)
from mcseg.report.cli import main as report_main
from mcseg.train import optimized_value
from mcseg.trials import TrialPruned, TrialReporter, open_storage
from tests.conftest import CONFIG_DIR, ROOT, TINY_2D, run_cli

# One trial: the tiny 2D task, two epochs (two validations), no post-hoc calibration.
TRIAL_JOB = TINY_2D + ["posthoc.fit=[]", "posthoc.apply=[]", "logger.images=0"]
PARSER = OverridesParser.create()


def _space(*lines: str):
    return search_space(PARSER.parse_overrides(list(lines)))


@pytest.mark.parametrize("line, expected", [
    ("loss.margin=interval(0.0, 15.0)", FloatDistribution(0.0, 15.0)),
    ("loss.margin=interval(1, 5)", FloatDistribution(1.0, 5.0)),  # Hydra's interval is of floats
    ("loss.alpha=tag(log, interval(0.001, 1.0))", FloatDistribution(0.001, 1.0, log=True)),
    ("x=range(1, 5)", IntDistribution(1, 4)),  # Hydra's range leaves its stop out
    ("x=range(0, 10, 3)", IntDistribution(0, 9, step=3)),
    ("x=tag(log, range(1, 9))", IntDistribution(1, 8, log=True)),
    ("x=range(0.5, 2.0, 0.5)", FloatDistribution(0.5, 1.5, step=0.5)),
    ("model=choice(unet, swin_unetr)", CategoricalDistribution(["unet", "swin_unetr"])),
    ("x=1,2,3", CategoricalDistribution([1, 2, 3])),
    ("x=choice('a b', true)", CategoricalDistribution(["a b", True])),
])
def test_search_space_reads_hydras_sweep_grammar(line, expected):
    space, fixed = _space(line)
    assert space == {line.split("=")[0]: expected} and fixed == []


def test_plain_values_pass_through_and_the_command_line_wins():
    params = ["loss.margin=interval(0, 1)", "seed=3", "loss.alpha=0.5"]  # hydra.sweeper.params, then the arguments
    space, fixed = _space(*params, "loss.margin=choice(1, 2)", "seed=4", "loss.alpha=interval(0.1, 0.2)")
    assert space == {"loss.margin": CategoricalDistribution([1, 2]), "loss.alpha": FloatDistribution(0.1, 0.2)}
    assert fixed == ["seed=4"]


@pytest.mark.parametrize("line, message", [
    ("x=tag(lin, interval(0, 1))", r"hydra.sweeper.params.x: unknown tag\(s\) \['lin'\]"),
    ("x=tag(log, choice(1, 2))", r"hydra.sweeper.params.x=tag\(log, choice\(1, 2\)\): tag\(log, ...\) applies"),
    ("x=choice([1,2], [3])", r"hydra.sweeper.params.x=.*choices must be numbers, strings or booleans"),
])
def test_a_search_space_optuna_cannot_take_names_its_key(line, message):
    with pytest.raises(ValueError, match=message):
        _space(line)


def _sweeper(tmp_path, monkeypatch, **kwargs):
    """An OptunaSweeper as Hydra sets it up (without a launcher: a refused sweep launches nothing), and this
    process's sweep state as a fresh sweep's."""
    from types import SimpleNamespace

    import mcseg.sweep
    from hydra_plugins.mcseg_optuna_sweeper.optuna_sweeper import OptunaSweeper

    monkeypatch.setattr(mcseg.sweep, "_stop_reason", None)
    monkeypatch.setattr(mcseg.sweep, "_made_sweep_dir", (tmp_path / "sweep").resolve(), raising=False)
    sweeper = OptunaSweeper(OmegaConf.create({"_target_": "optuna.samplers.TPESampler"}),
                            OmegaConf.create({"_target_": "optuna.pruners.NopPruner"}), **kwargs)
    sweeper.hydra_context, sweeper.sweep_dir = SimpleNamespace(config_loader=None), tmp_path / "sweep"
    sweeper.sweep_dir.mkdir()  # made by mcseg.sweep.OutputDirCheck before the sweeper runs
    return sweeper


@pytest.mark.parametrize("storage, arguments, says", [
    ("optuna.db", [], r"'hydra.sweeper.storage'=optuna.db: not a database URL \(e.g. sqlite:///"),
    ("sqlite:///{tmp}/missing/optuna.db", [], r"storage'=sqlite:///.*: the folder of its SQLite file, .*missing, does "
                                             r"not exist"),
    ("mysql://user:secret@localhost/study", [], r"storage'=mysql://user:\*\*\*@localhost/study: the driver of mysql "
                                                r"is not installed"),
    ("nosuchdb://host/study", [], r"SQLAlchemy knows no database 'nosuchdb'"),
    (None, ["loss.margin=interval(5, 1)"], r"hydra.sweeper.params.loss.margin=interval\(5, 1\): .*low"),
], ids=["bare-file", "missing-folder", "missing-driver", "unknown-database", "empty-interval"])
def test_a_sweep_that_cannot_work_is_one_paragraph_naming_its_key_and_no_advice(storage, arguments, says, tmp_path,
                                                                                 monkeypatch, capsys, caplog):
    """A storage or search space that cannot work ends the sweep before its first trial with one paragraph naming
    the key (not Optuna's or SQLAlchemy's traceback), exit status 1; at exit no sweep summary and no advice to rerun
    with trainer.auto_resume=true (nothing ran); the sweep folder this launch made is removed."""
    import mcseg.sweep

    monkeypatch.setitem(sys.modules, "MySQLdb", None)  # mysql's driver not installed, whatever this machine has
    monkeypatch.chdir(tmp_path)
    sweeper = _sweeper(tmp_path, monkeypatch, storage=storage and storage.format(tmp=tmp_path))
    with pytest.raises(SystemExit) as ended:
        sweeper.sweep(arguments)
    err = capsys.readouterr().err
    assert ended.value.code == 1 and err.startswith("error: ") and err.count("\n") == 1, err
    assert re.search(says, err) and "secret" not in err, err
    summary = mcseg.sweep.SweepSummary()
    summary.sweep_dir = sweeper.sweep_dir
    summary._at_exit()
    assert not sweeper.sweep_dir.exists() and "auto_resume" not in caplog.text + capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no optuna.db either


@pytest.mark.slow
def test_a_bad_storage_on_the_command_line_is_one_paragraph(tmp_path):
    """The same from ``train.py -m``: Hydra's traceback and the advice to continue are gone."""
    done = run_cli("train.py", ["hparams_search=margin_optuna", "hydra.sweeper.storage=optuna.db",
                                f"hydra.sweep.dir={tmp_path / 'sweep'}", *TRIAL_JOB])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1 and "hydra.sweeper.storage" in lines[0], done.stderr
    assert "auto_resume" not in done.stdout + done.stderr and not (tmp_path / "sweep").exists()


def test_grid_sampler_takes_choices_and_integer_ranges_only():
    space, _ = _space("a=choice(x, y)", "b=range(0, 6, 2)")
    assert grid_of(space) == {"a": ["x", "y"], "b": [0, 2, 4]}
    with pytest.raises(ValueError, match=r"hydra.sweeper.params.c: the grid sampler needs"):
        grid_of(_space("c=interval(0, 1)")[0])


@pytest.mark.parametrize("value", ["sqlite:////tmp/a b/optuna.db", "margin,v2=(x)", 0.001, 3, True])
def test_job_overrides_give_back_the_values(value):
    assert PARSER.parse_overrides([f"k={as_value(value)}"])[0].value() == value


def _ended(status: JobStatus, value) -> JobReturn:
    ret = JobReturn(overrides=["loss.margin=1"])
    ret.status, ret.return_value = status, value
    return ret


def test_the_study_is_told_each_jobs_outcome(capsys):
    study = optuna.create_study(direction="maximize")
    outcomes = [(JobStatus.COMPLETED, 0.25, TrialState.COMPLETE),
                (JobStatus.COMPLETED, None, TrialState.FAIL),  # run_job's failed job inside a multirun
                (JobStatus.COMPLETED, float("nan"), TrialState.FAIL),
                (JobStatus.FAILED, TrialPruned("pruned after epoch 1"), TrialState.PRUNED),
                (JobStatus.FAILED, RuntimeError("boom"), TrialState.FAIL)]
    for status, value, _ in outcomes:
        tell(study, study.ask({"x": FloatDistribution(0, 1)}), _ended(status, value))
    assert [t.state for t in study.trials] == [state for *_, state in outcomes]
    assert study.best_value == 0.25
    assert "Error executing job" not in capsys.readouterr().err  # not Hydra's message for a failed job


def test_trials_of_a_sweep_process_that_ended_are_failed_at_the_next_start():
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    owners = {"gone": {"host": socket.gethostname(), "pid": int(ended.stdout)},
              "alive": {"host": socket.gethostname(), "pid": os.getpid()},
              "elsewhere": {"host": "another-node", "pid": int(ended.stdout)}}
    study = optuna.create_study()
    for owner in owners.values():
        study.ask().set_user_attr("sweeper", owner)
    fail_orphans(study)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]


def test_reporter_reports_the_optimised_score_and_asks_the_pruner(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    first = study.ask()
    first.report(0.5, 1)
    study.tell(first, 0.5)
    cfg = OmegaConf.create({"optimized_metric": "score", "score": {"mean_foreground_dice": 1.0, "mean_ece": -1.0}})

    def score_of(metrics):
        return optimized_value(metrics, cfg)

    reporter = TrialReporter(study.ask(), score_of, "score")
    # a score of 0.7 - 0.1 = 0.6 beats the median of the trials before (0.5) at epoch 1; 0.2 - 0.1 does not
    assert reporter.report(1, {"val/mean_foreground_dice": 0.7, "val/mean_ece": 0.1}) is None
    assert reporter.report(2, {"val/mean_foreground_dice": 0.2, "val/mean_ece": 0.1}) is None  # no epoch 2 before
    assert reporter.report(1, {"val/mean_ece": 0.1}) is None  # no score: not reported
    reopened = optuna.load_study(study_name="s", storage=open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"))
    assert reopened.trials[1].intermediate_values == {1: pytest.approx(0.6), 2: pytest.approx(0.1)}
    low = TrialReporter(study.ask(), score_of, "score").report(1, {"val/mean_foreground_dice": 0.3,
                                                                   "val/mean_ece": 0.1})
    assert low.startswith("trial 2 pruned") and "epoch 1 (score 0.2)" in low


def test_the_reported_value_is_the_optimised_metric():
    metrics = {"val/mean_foreground_dice": 0.7, "val/mean_ece": 0.1}
    weights = {"mean_foreground_dice": 1.0, "mean_ece": -1.0}
    assert optimized_value(metrics, OmegaConf.create({"score": weights})) == pytest.approx(0.6)
    dice = OmegaConf.create({"optimized_metric": "val/mean_foreground_dice", "score": weights})
    assert optimized_value(metrics, dice) == 0.7


def test_a_pruned_training_stops_after_its_checkpoints_with_status_pruned(make_cfg, tmp_path, monkeypatch):
    import torch

    from mcseg.sweep import run_job
    from mcseg.train import train

    study = optuna.create_study(storage=open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"), direction="maximize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    before = study.ask()
    before.report(10.0, 1)  # a score no tiny run reaches
    study.tell(before, 10.0)
    trial = study.ask()
    monkeypatch.setattr("mcseg.train.trial_reporter", lambda value_of, metric: TrialReporter(trial, value_of, metric))
    cfg = make_cfg(TRIAL_JOB + ["logger=csv"])
    with pytest.raises(TrialPruned, match="trial 1 pruned by the study's pruner after the validation of epoch 1"):
        run_job(train, cfg, checks_itself=True)
    run = Path(cfg.paths.output_dir)
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "pruned" and "epoch 1" in status["error"]
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=False)["epoch"] == 1  # kept, after epoch 1
    assert not (run / "result.json").exists() and not (run / "eval").exists()
    assert list(study.trials[1].intermediate_values) == [1]


def test_a_pruned_trial_ends_the_other_ranks_quietly(make_cfg, tmp_path, monkeypatch):
    """Under torchrun or submitit's tasks, rank 0 records the pruned trial; a rank > 0 must not fail the job."""
    from mcseg.sweep import run_job

    def pruned(cfg):
        raise TrialPruned("trial 3 pruned")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    cfg = make_cfg(TRIAL_JOB)
    assert run_job(pruned, cfg) is None
    assert not (Path(cfg.paths.output_dir) / "status.json").exists()  # rank 0's file


def test_margin_preset_composes_the_optuna_sweeper_with_each_pruner():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["hparams_search=margin_optuna"], return_hydra_config=True)
        pruners = {name: compose("train", overrides=["hparams_search=margin_optuna", f"hydra/sweeper/pruner={name}"],
                                 return_hydra_config=True).hydra.sweeper.pruner
                   for name in ("none", "median", "successive_halving", "hyperband")}
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("mcseg_optuna_sweeper.optuna_sweeper.OptunaSweeper")
    assert (sweeper.direction, sweeper.study_name, sweeper.n_trials) == ("maximize", "margin", 20)
    assert sweeper.storage is None and sweeper.pruner._target_ == "optuna.pruners.NopPruner"
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed == 1234
    assert dict(sweeper.params) == {"loss.margin": "interval(0.0, 15.0)",
                                    "loss.alpha": "tag(log, interval(0.001, 1.0))"}
    assert [type(instantiate(p)).__name__ for p in pruners.values()] == \
        ["NopPruner", "MedianPruner", "SuccessiveHalvingPruner", "HyperbandPruner"]


def _trial_dirs(sweep: Path) -> dict[int, Path]:
    return {int(p.parent.name.split("_")[0]): p.parent for p in sweep.glob("*/status.json")}


def _optuna_sweep(sweep: Path, storage: Path, *extra: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return run_cli("train.py", ["hparams_search=margin_optuna", f"hydra.sweeper.storage=sqlite:///{storage}",
                                "hydra.sweeper.sampler.n_startup_trials=1", f"hydra.sweep.dir={sweep}", *TRIAL_JOB,
                                *extra], timeout=timeout)


@pytest.fixture(scope="module")
def margin_study(tmp_path_factory) -> Path:
    """`python train.py -m hparams_search=margin_optuna` (the preset sets -m): two trials of a learning rate that
    learns."""
    root = tmp_path_factory.mktemp("optuna")
    proc = _optuna_sweep(root / "first", root / "optuna.db", "hydra.sweeper.n_trials=2", "optim.lr=1e-2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def test_margin_optuna_runs_on_current_optuna_and_reports_every_validation(margin_study):
    assert int(optuna.__version__.split(".")[0]) >= 4
    sweep = margin_study / "first"
    trials = _trial_dirs(sweep)
    assert sorted(trials) == [0, 1]  # job number = trial number
    results = {n: json.loads((d / "result.json").read_text()) for n, d in trials.items()}
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(max(r["score"] for r in results.values()))
    assert best["trials"] == {"complete": 2}
    study = optuna.load_study(study_name="margin", storage=f"sqlite:///{margin_study / 'optuna.db'}")
    for trial in study.trials:
        result = results[trial.number]
        assert 0 <= trial.params["loss.margin"] <= 15 and result["run"]["loss"]["margin"] == trial.params["loss.margin"]
        assert trial.value == pytest.approx(result["score"])
        # the job reported each validation; the one of its best epoch is the value the study was told
        assert sorted(trial.intermediate_values) == [1, 2]
        assert trial.intermediate_values[result["best_epoch"]] == pytest.approx(result["score"])


@pytest.mark.slow  # about 40 s on 2 cores: a second sweep process (the trainer's side: the test above)
def test_a_hopeless_learning_rate_is_pruned_and_the_resumed_study_goes_on(margin_study, tmp_path):
    sweep = margin_study / "resumed"
    # the same study again, up to 4 trials, with a learning rate that cannot learn and a median pruner
    proc = _optuna_sweep(sweep, margin_study / "optuna.db", "hydra.sweeper.n_trials=4", "optim.lr=1e-9",
                         "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="margin", storage=f"sqlite:///{margin_study / 'optuna.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2 + [TrialState.PRUNED] * 2
    assert all(sorted(t.intermediate_values) == [1] for t in study.trials[2:])  # after its first validation
    assert len({tuple(t.params.values()) for t in study.trials}) == 4  # the resumed sampler drew new values
    trials = _trial_dirs(sweep)
    assert sorted(trials) == [2, 3]  # the count went on; trial 3 ran after trial 2 was pruned
    for job in trials.values():
        status = json.loads((job / "status.json").read_text())
        assert status["status"] == "pruned" and "after the validation of epoch 1" in status["error"]
        assert (job / "checkpoints" / "last.pt").is_file() and not (job / "result.json").exists()
    assert json.loads((sweep / "sweep_summary.json").read_text())["counts"] == {"pruned": 2}
    assert yaml.safe_load((sweep / "optimization_results.yaml").read_text())["trials"] == {"complete": 2, "pruned": 2}
    assert report_main([str(margin_study / "first"), str(sweep), "--out", str(tmp_path / "report"), "--no-eval",
                        "--bootstrap", "20", "--baseline", "none"]) == 0
    left_out = (tmp_path / "report" / "report.md").read_text().split("## Runs left out")[1]
    assert left_out.count("| pruned |") == 2


@pytest.mark.slow  # about 40 s on 2 cores: two sweep processes at once
def test_two_processes_share_one_study(tmp_path):
    args = ["hparams_search=margin_optuna", f"hydra.sweeper.storage=sqlite:///{tmp_path / 'optuna.db'}",
            "hydra.sweeper.n_trials=4", "trainer.max_epochs=1", *TRIAL_JOB]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, f"hydra.sweep.dir={tmp_path / name}"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("a", "b")]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    study = optuna.load_study(study_name="margin", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert [t.number for t in study.trials] == [0, 1, 2, 3]  # n_trials is the shared study's size
    assert {t.state for t in study.trials} == {TrialState.COMPLETE}
    assert len({tuple(t.params.values()) for t in study.trials}) == 4  # each trial drawn with its own seed
    by_process = [_trial_dirs(tmp_path / name) for name in ("a", "b")]
    assert sorted([*by_process[0], *by_process[1]]) == [0, 1, 2, 3] and all(by_process)
    sweepers = {t.user_attrs["sweeper"]["pid"] for t in study.trials}
    assert sweepers == {p.pid for p in procs}


@pytest.mark.slow  # 30 to 60 s each: the launchers' worker processes report to the study through its storage
@pytest.mark.parametrize("launcher", ["parallel", "submitit_debug"])  # joblib; submitit's local executor
def test_launchers_workers_report_to_the_study(tmp_path, launcher):
    proc = _optuna_sweep(tmp_path / "sweep", tmp_path / "optuna.db", f"hydra/launcher={launcher}",
                         "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="margin", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert all(sorted(t.intermediate_values) == [1, 2] for t in study.trials)
    pids = {json.loads((d / "status.json").read_text())["pid"] for d in _trial_dirs(tmp_path / "sweep").values()}
    assert len(pids) == 2 and os.getpid() not in pids
