"""An Optuna trial seen from its job: the study's storage, the trial's reports, and pruning.

mcseg's Optuna sweeper (``hydra/sweeper=optuna``, in ``hydra_plugins/mcseg_optuna_sweeper``) asks its
study for a trial and launches a job whose Hydra overrides name it: ``hydra.sweeper.trial=<number>``,
with the study's ``storage`` (:func:`open_storage`: a database URL, a journal file or a gRPC proxy) and
``study_name``. The job opens that storage itself,
so this works from whichever process or machine the launcher runs it on (basic, joblib, submitit):
after every running validation it reports the value the sweep optimises to its trial, and when the
study's pruner (``hydra.sweeper.pruner``) says so the training stops with :class:`TrialPruned`, its
checkpoints written. The job then ends with status ``pruned`` and the sweeper tells the study.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

from mcseg.errors import ConfigError

log = logging.getLogger(__name__)

STORAGE_FILE = "optuna.db"  # the study's SQLite file in the sweep directory when no storage is configured
SQLITE_TIMEOUT_S = 60  # how long a process waits for another's write to the shared SQLite file


class TrialPruned(RuntimeError):
    """The study's pruner stopped this trial after a validation (its checkpoints are kept).

    One argument only, so that it pickles: the joblib and submitit launchers send it back to the sweeper.
    """


def storage_url(storage: str | None, sweep_dir: str | Path) -> str:
    """The study's storage: ``storage`` as configured, or an SQLite file in the sweep directory."""
    return str(storage) if storage else f"sqlite:///{Path(sweep_dir).resolve() / STORAGE_FILE}"


STORAGE_KEY = "hydra.sweeper.storage"
STORAGE_EXAMPLES = ("e.g. sqlite:////<absolute path>/optuna.db, sqlite:///optuna.db (in the working directory) or "
                    "postgresql://<user>@<host>/<database>; null: <sweep dir>/optuna.db")


def check_storage(url: str) -> None:
    """Refuse, before the study is opened, a storage URL that cannot work, naming ``hydra.sweeper.storage``: not a
    database URL (a bare file name), a database whose driver is not installed, an SQLite file in a folder that
    does not exist. A journal file or a gRPC proxy (``journal:``, ``grpc://``) is checked by :func:`open_storage`."""
    if url.startswith((JOURNAL, GRPC)):
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"config key '{STORAGE_KEY}'={url}: not a database URL ({STORAGE_EXAMPLES})") from None
    where = f"config key '{STORAGE_KEY}'={shown_url(url)}"
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise ConfigError(f"{where}: SQLAlchemy knows no database {parsed.drivername!r} ({STORAGE_EXAMPLES})") from None
    try:
        dialect.import_dbapi() if hasattr(dialect, "import_dbapi") else dialect.dbapi()
    except ImportError as exc:
        raise ConfigError(f"{where}: the driver of {parsed.drivername} is not installed ({exc}); install it in "
                          f"this environment (and the jobs'), or use an SQLite file ({STORAGE_EXAMPLES})") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = Path(parsed.database).expanduser().absolute().parent
        if not folder.is_dir():
            raise ConfigError(f"{where}: the folder of its SQLite file, {folder}, does not exist; create it or "
                              f"give another path ({STORAGE_EXAMPLES})")


def shown_url(url: str) -> str:
    """A storage URL for messages and logs: its password, if any, as ``***``."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url
JOURNAL, GRPC = "journal:", "grpc://"
STORAGE_FORMS = ("an SQLAlchemy database URL (sqlite:///FILE, postgresql://HOST/DB, mysql://...)",
                 "journal:PATH (a journal file; journal:///abs/path for an absolute one)",
                 "grpc://HOST:PORT (Optuna's gRPC storage proxy)")


def open_storage(url: str, attempts: int = 3):
    """The Optuna storage that ``url`` names (``hydra.sweeper.storage``); a ValueError naming it when it cannot be.

    * ``journal:PATH``: ``JournalStorage(JournalFileBackend(PATH, JournalFileOpenLock(PATH)))``, Optuna's storage
      for a shared (network) file system without a database server; the lock is a file made with ``O_EXCL``
      beside the journal (NFSv3 or later), so the journal's folder must be writable.
    * ``grpc://HOST:PORT``: ``GrpcStorageProxy``, a client of ``optuna.storages.run_grpc_proxy_server``, which
      serves one storage to many workers (``python -m mcseg.optuna_proxy``).
    * anything else is an RDB URL of a dialect SQLAlchemy knows; an SQLite file is shared by processes that
      wait for each other's writes. Processes that open a new RDB at the same moment race to create its tables
      (the loser's insert of the schema version fails): the loser opens it again, and finds it made.
    """
    if url.startswith(JOURNAL):
        return _journal(url)
    if url.startswith(GRPC):
        return _grpc(url)
    import optuna
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError

    try:
        make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ValueError(f"hydra.sweeper.storage={url!r} is not a storage Optuna can open ({exc}); expected "
                         + "; ".join(STORAGE_FORMS)) from None
    engine = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if url.startswith("sqlite") else None
    for attempt in range(1, attempts + 1):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine)
        except (IntegrityError, OperationalError):
            if attempt == attempts:
                raise
            time.sleep(0.2 * attempt)


def journal_path(url: str) -> Path:
    """The file of a ``journal:PATH`` storage (``journal:///abs/path`` gives ``/abs/path``)."""
    path = url[len(JOURNAL):]
    path = path[2:] if path.startswith("///") else path
    if not path or path.startswith("//"):
        raise ValueError(f"hydra.sweeper.storage={url!r}: expected journal:PATH or journal:///ABSOLUTE/PATH")
    return Path(path).expanduser().resolve()


def _journal(url: str):
    import os

    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    path = journal_path(url)
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"hydra.sweeper.storage={url!r}: the journal's folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"hydra.sweeper.storage={url!r}: {folder if not os.access(folder, os.W_OK) else path} "
                         "is not writable (the journal and its lock file are written there by every process)")
    try:
        return JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
    except OSError as exc:
        raise ValueError(f"hydra.sweeper.storage={url!r}: cannot open the journal {path}: "
                         f"{exc.strerror or exc}") from None


def _grpc(url: str):
    from urllib.parse import urlsplit

    from optuna.storages import GrpcStorageProxy

    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"hydra.sweeper.storage={url!r}: expected grpc://HOST:PORT (Optuna's gRPC storage proxy)")
    return GrpcStorageProxy(host=parts.hostname, port=port)


class TrialReporter:
    """Reports each validation of a job to its Optuna trial and asks the study's pruner whether to stop.

    ``value_of(metrics)``: the value the sweep optimises (``metric``) from one validation's metrics, or None when
    it was not measured (:func:`mcseg.train.optimized_value`).
    """

    def __init__(self, trial: Any, value_of: Callable[[dict], float | None], metric: str) -> None:
        self.trial, self.value_of, self.metric = trial, value_of, metric

    def report(self, epoch: int, metrics: dict) -> str | None:
        """Report epoch ``epoch``'s validation ``metrics``; why the trial is pruned, or None to go on."""
        value = self.value_of(metrics)
        if value is None or not math.isfinite(value):  # nothing to compare: the pruner is not asked
            log.warning("trial %d: no %s at epoch %d; not reported", self.trial.number, self.metric, epoch)
            return None
        self.trial.report(float(value), epoch)
        if not self.trial.should_prune():
            return None
        return (f"trial {self.trial.number} pruned by the study's pruner after the validation of epoch {epoch} "
                f"({self.metric} {value:.4g})")


def trial_reporter(value_of: Callable[[dict], float | None], metric: str) -> TrialReporter | None:
    """The reporter of this job's Optuna trial (see :class:`TrialReporter`), or None outside an Optuna sweep
    (``hydra.sweeper.trial`` unset in the job's Hydra config)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    sweeper = HydraConfig.get().sweeper
    number = sweeper.get("trial")
    if number is None:
        return None
    import optuna
    from hydra.utils import instantiate

    storage, name = open_storage(str(sweeper.storage)), str(sweeper.study_name)
    study = optuna.load_study(study_name=name, storage=storage, pruner=instantiate(sweeper.pruner))
    trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(name), int(number))
    return TrialReporter(optuna.trial.Trial(study, trial_id), value_of, metric)
