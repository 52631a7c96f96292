"""Optuna's ask-and-tell interface as a Hydra sweeper (``hydra/sweeper=optuna``, configs/hydra/sweeper/optuna.yaml).

* Search space: ``hydra.sweeper.params`` and the command line, in Hydra's override grammar:
  ``interval(a, b)`` (floats), ``range(a, b[, step])`` (the values Hydra's range gives, ``b`` excluded:
  integers when all are), ``choice(a, b, ...)`` or ``a,b,...``; ``tag(log, ...)`` samples
  an interval or range on a log scale. A plain value is passed to every trial unchanged. The command
  line wins over ``params`` for a key given in both.
* Each batch asks the study for ``n_jobs`` trials, launches them (job number = trial number) and tells
  the study each job's outcome: its returned value, ``pruned`` (the job's pruner stopped it:
  :class:`mcseg.trials.TrialPruned`) or ``failed`` (no value, or an error).
* The study lives in a storage (``storage``: an RDB URL, by default ``<sweep dir>/optuna.db``, a journal file
  ``journal:PATH`` or Optuna's gRPC proxy ``grpc://HOST:PORT``: :func:`mcseg.trials.open_storage`), which the
  jobs open to report their validations (:mod:`mcseg.trials`). ``n_trials`` is the study's size: the same
  command run again with the same storage and ``study_name`` continues its count up to ``n_trials``,
  and several processes sharing one storage share that count. A trial left running by a sweep process
  that has ended (on this host) is told failed when a sweep of its study starts and before each batch of the
  sweeps running on it (Optuna's heartbeat does this for RDB storages only: docs/scaling.md).
* A sampler with a ``seed`` draws trial ``n`` with ``seed + n`` (:class:`TrialSeeded`): a seeded sweep is
  reproducible, and a resumed study, or several processes sharing one, never draw one trial's values twice.
"""
from __future__ import annotations

import logging
import math
import os
import socket
from itertools import groupby
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from mcseg.files import atomic_write
from mcseg.sweep import refuse_sweep
from mcseg.trials import TrialPruned, check_storage, open_storage, shown_url, storage_url

log = logging.getLogger(__name__)

RESULTS_FILE = "optimization_results.yaml"
DIRECTIONS = ("minimize", "maximize")


class OptunaSweeper(Sweeper):
    """Hydra sweeper over an Optuna study (see the module's docstring). ``trial`` is set per job, never here."""

    def __init__(self, sampler: DictConfig, pruner: DictConfig, direction: str = "minimize",
                 storage: str | None = None, study_name: str | None = None, n_trials: int = 20, n_jobs: int = 1,
                 params: dict[str, str] | None = None, trial: int | None = None) -> None:
        from hydra.utils import instantiate

        if str(direction) not in DIRECTIONS:
            raise ValueError(f"hydra.sweeper.direction={direction!r}: expected one of {', '.join(DIRECTIONS)}")
        if n_trials < 1 or n_jobs < 1:
            raise ValueError(f"hydra.sweeper.n_trials={n_trials}, n_jobs={n_jobs}: both must be >= 1")
        self.sampler_cfg, self.pruner, self.direction = sampler, instantiate(pruner), str(direction)
        self.storage, self.study_name = storage, study_name
        self.n_trials, self.n_jobs, self.params = n_trials, n_jobs, dict(params or {})
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)
        self.sweep_dir = Path(str(config.hydra.sweep.dir))

    def sweep(self, arguments: list[str]) -> None:
        try:  # a config error is one paragraph naming its key, before anything is written (mcseg.sweep.refuse_sweep)
            space, fixed = self._search_space(arguments)
            self.url = storage_url(self.storage, self.sweep_dir)
            check_storage(self.url)
            self.sweep_dir.mkdir(parents=True, exist_ok=True)
            study = self._open_study(space)
        except ValueError as exc:  # ConfigError, and what Optuna or the storage refuse (_search_space, _open_study)
            refuse_sweep(exc)
        ours = [f"hydra.sweeper.storage={as_value(self.url)}", f"hydra.sweeper.study_name={as_value(study.study_name)}"]
        while True:
            fail_orphans(study)  # a killed sweeper's trial (on this host) is failed before it is counted
            left = self.n_trials - len(counted_trials(study))
            if left <= 0:
                break
            trials = [study.ask(space) for _ in range(min(self.n_jobs, left))]
            for trial in trials:  # who asked: a trial whose sweep process has ended is failed at the next start
                trial.set_user_attr("sweeper", {"host": socket.gethostname(), "pid": os.getpid()})
            jobs = [fixed + [f"{k}={as_value(v)}" for k, v in t.params.items()] + ours
                    + [f"hydra.sweeper.trial={t.number}"] for t in trials]
            self.validate_batch_is_legal(jobs)
            for trial, ret in zip(trials, self._launch(trials, jobs)):
                tell(study, trial, ret)
        self._write_results(study)

    def _search_space(self, arguments: list[str]) -> tuple[dict, list[str]]:
        """:func:`search_space` of ``params`` and the command line; an override Hydra cannot parse is a
        ValueError naming it."""
        from hydra.errors import HydraException

        lines = [f"{k}={v}" for k, v in self.params.items()] + list(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        try:
            overrides = parser.parse_overrides(lines)
        except HydraException as exc:
            raise ValueError(f"hydra.sweeper.params or the command line: {str(exc).splitlines()[0]}") from None
        return search_space(overrides)

    def _open_study(self, space: dict):
        """The study in ``self.url``; a storage that cannot be opened is a ValueError naming the key."""
        import optuna
        from sqlalchemy.exc import SQLAlchemyError

        try:
            storage = open_storage(self.url)
        except SQLAlchemyError as exc:
            raise ValueError(f"config key 'hydra.sweeper.storage'={shown_url(self.url)}: the study's storage cannot "
                             f"be opened ({str(exc).splitlines()[0]})") from None
        study = optuna.create_study(storage=storage, sampler=self._sampler(space),
                                    pruner=self.pruner, study_name=self.study_name, direction=self.direction,
                                    load_if_exists=True)
        if study.direction.name.lower() != self.direction:
            raise ValueError(f"hydra.sweeper.direction={self.direction}: study {study.study_name!r} in {self.url} "
                             f"was created to {study.direction.name.lower()}; use another study_name or storage")
        fail_orphans(study)
        log.info("Optuna study %r in %s: %d of %d trials; sampler %s, pruner %s", study.study_name, self.url,
                 len(counted_trials(study)), self.n_trials, self.sampler_cfg._target_, type(self.pruner).__name__)
        return study

    def _sampler(self, space: dict):
        """The configured sampler; with a ``seed``, seeded afresh for each trial (:class:`TrialSeeded`)."""
        from hydra.utils import instantiate

        extra = {"search_space": grid_of(space)} if self.sampler_cfg.get("_partial_") else {}  # the grid sampler

        def make(seed: int | None):
            return instantiate(self.sampler_cfg, **extra, **({} if seed is None else {"seed": seed}), _partial_=False)

        seed = self.sampler_cfg.get("seed")
        return make(None) if seed is None else TrialSeeded(make, int(seed))

    def _launch(self, trials: list, jobs: list[list[str]]) -> list:
        """Launch ``jobs``, each numbered by its trial: runs of consecutive trial numbers go in one launch
        (they are not consecutive when another process asked the shared study meanwhile)."""
        returns: list = []
        positions = enumerate(zip(trials, jobs))
        for _, group in groupby(positions, key=lambda position: position[1][0].number - position[0]):
            pairs = [pair for _, pair in group]  # (trial, its job's overrides), numbers consecutive
            returns += self.launcher.launch([overrides for _, overrides in pairs], initial_job_idx=pairs[0][0].number)
        return returns

    def _write_results(self, study) -> None:
        """``optimization_results.yaml`` in the sweep directory: the best trial so far and the study's counts."""
        from optuna.trial import TrialState

        states = [t.state for t in study.get_trials(deepcopy=False)]  # one read: other processes go on meanwhile
        counts = {s.name.lower(): states.count(s) for s in TrialState}
        record = {"name": "optuna", "study_name": study.study_name, "storage": self.url, "direction": self.direction,
                  "trials": {k: n for k, n in counts.items() if n}}
        if counts["complete"]:
            record.update(best_trial=study.best_trial.number, best_params=study.best_params,
                          best_value=study.best_value)
        text = yaml.safe_dump(record, sort_keys=False)
        atomic_write(self.sweep_dir / RESULTS_FILE, lambda tmp: tmp.write_text(text))
        log.info("Optuna study %r: %s; best %s", study.study_name, record["trials"],
                 f"trial {record['best_trial']}: {record['best_value']} {record['best_params']}"
                 if counts["complete"] else "none (no trial completed)")


class TrialSeeded:
    """An Optuna sampler made afresh with ``seed`` + the trial's number before each trial (``make(seed)``).

    One seeded sampler per process would repeat its first draws in a resumed study, and in each of several
    processes started together on one study; the trial number is unique within the study.
    """

    def __init__(self, make, seed: int) -> None:
        self.make, self.seed = make, seed
        self.inner = make(seed)

    def before_trial(self, study, trial) -> None:  # Optuna calls it before the trial's first draw
        self.inner = self.make(self.seed + trial.number)
        self.inner.before_trial(study, trial)

    def __getattr__(self, name: str):  # the rest of Optuna's sampler interface, as the inner sampler does it
        return getattr(self.inner, name)


def search_space(overrides: list[Override]) -> tuple[dict, list[str]]:
    """(Optuna distributions by key, the plain overrides every trial gets); a later override of a key wins."""
    space: dict = {}
    fixed: dict[str, str] = {}
    for override in overrides:
        key = override.get_key_element()
        space.pop(key, None)
        fixed.pop(key, None)
        if override.is_sweep_override():
            space[key] = distribution(key, override)
        else:
            fixed[key] = override.input_line or f"{key}={override.get_value_element_as_str()}"
    return space, list(fixed.values())


def distribution(key: str, override: Override):
    """The Optuna distribution of one swept key (``interval``, ``range``, ``choice``, with ``tag(log, ...)``)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    sweep = override.value()
    unknown = set(sweep.tags) - {"log"}
    if unknown:
        raise ValueError(f"hydra.sweeper.params.{key}: unknown tag(s) {sorted(unknown)}; the only tag is 'log'")
    log_scale = "log" in sweep.tags
    try:
        if override.is_interval_sweep():  # Hydra's interval is always of floats (integers: range)
            return FloatDistribution(float(sweep.start), float(sweep.end), log=log_scale)
        values = [v.text if hasattr(v, "text") else v for v in override.sweep_iterator()]
        if not values:
            raise ValueError("no values")
        if override.is_range_sweep():
            if all(isinstance(v, int) for v in values):
                return IntDistribution(values[0], values[-1], log=log_scale, step=int(sweep.step))
            step = None if log_scale else float(sweep.step)  # Optuna takes no step on a log scale
            return FloatDistribution(values[0], values[-1], log=log_scale, step=step)
        if log_scale:
            raise ValueError("tag(log, ...) applies to interval and range only")
        if not all(isinstance(v, (str, int, float, bool)) for v in values):
            raise ValueError(f"choices must be numbers, strings or booleans, got {values}")
        return CategoricalDistribution(values)
    except ValueError as exc:
        raise ValueError(f"hydra.sweeper.params.{key}={override.get_value_string()}: {exc}") from exc


def grid_of(space: dict) -> dict[str, list]:
    """The grid sampler's search space: every value of each choice and integer range."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    grid = {}
    for key, dist in space.items():
        if isinstance(dist, CategoricalDistribution):
            grid[key] = list(dist.choices)
        elif isinstance(dist, IntDistribution) and not dist.log:
            grid[key] = list(range(dist.low, dist.high + 1, dist.step))
        else:
            raise ValueError(f"hydra.sweeper.params.{key}: the grid sampler needs choice(...) or an integer range, "
                             f"not {type(dist).__name__}")
    return grid


def as_value(value: Any) -> str:
    """``value`` as the value part of a Hydra override (strings escaped as Hydra's grammar needs)."""
    return Override._get_value_element_as_str(value)


def counted_trials(study) -> list:
    """The trials that count towards ``n_trials``: finished ones and those running (in any process)."""
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL,
                                                    TrialState.RUNNING))


def tell(study, trial, ret) -> None:
    """Tell the study how ``trial``'s job (Hydra's ``JobReturn``) ended: its value, pruned or failed."""
    from hydra.core.utils import JobStatus
    from optuna.trial import TrialState

    if ret.status != JobStatus.COMPLETED:  # its exception, read without JobReturn.return_value's error message
        exc = ret._return_value
        if isinstance(exc, TrialPruned):
            study.tell(trial, state=TrialState.PRUNED)
            log.info("trial %d pruned: %s", trial.number, exc)
        else:  # the job raised past mcseg's own handling
            study.tell(trial, state=TrialState.FAIL)
            log.error("trial %d failed: %s: %s", trial.number, type(exc).__name__, exc)
        return
    value = ret.return_value
    if value is None or not math.isfinite(float(value)):
        study.tell(trial, state=TrialState.FAIL)
        log.warning("trial %d failed: its job returned %s (see its status.json)", trial.number, value)
        return
    study.tell(trial, float(value))
    log.info("trial %d: %s %s", trial.number, float(value), trial.params)


def fail_orphans(study) -> None:
    """Tell failed the running trials whose sweep process has ended on this host (killed sweeps): they would
    otherwise stay running and count towards ``n_trials`` forever. Trials asked on other hosts are left alone.
    Called at a sweep's start and before each batch, so the sweepers sharing a study fail a killed one's trial
    (two of them may tell it at once: the second finds it finished and leaves it)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    from mcseg.rundir import holder_gone

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get("sweeper") or {}
        why = holder_gone({**owner, "age_s": 0.0}) if owner.get("pid") else None
        if why:
            try:
                study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
            except UpdateFinishedTrialError:
                continue
            log.warning("trial %d of study %r was left running (%s): told failed", trial.number,
                        study.study_name, why)
