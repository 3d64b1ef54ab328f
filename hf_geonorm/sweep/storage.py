"""A sweep shared by many machines (``sweep --storage postgresql://...``): the runs of one sweep are the trials of an
Optuna study in a PostgreSQL database, and every machine running the same command takes the next run the protocol
needs (``protocol.walk``) that no machine has finished or is training.

- The study holds the sweep's header (its identity, ``record.sweep_header``: the train options, the settings its
  runs share, the fingerprints of the data, the tokenizer and the model) and its grid; a machine with another
  identity or grid is refused before it trains, with the difference named (``record.check_same_sweep``), and every
  finished run read from the study is checked against the header (``record.check_record``) before it counts.
- Taking a run is one step under a PostgreSQL advisory lock (the protocol read, the run's trial created RUNNING), so
  no two machines take the same run; a finished run is its trial COMPLETE with its journal entry, written in one
  step, so a run's half-written output is never read.
- A machine beats a heartbeat for each run it trains (Optuna's, timed by the database's clock); a run whose
  heartbeat is older than ``--takeover-after`` seconds is failed (its machine died) and taken by the next machine
  that looks; a result that comes back for a run taken over is dropped, so no run counts twice.
- The database may go away between two steps (a restart): each step is retried until it is back, for as long as
  ``--takeover-after`` at least. Only that is waited out (``lost_connection``): a malformed URL, a study name
  longer than Optuna stores, a database that cannot be reached when the machine first connects (a closed port,
  an unknown host), a refused login, a missing database and any other error of the database fail at once, with
  the database's own words.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
import zlib
from collections.abc import Callable
from contextlib import contextmanager, suppress
from typing import Any

from .._plumbing.declarations import OptionError
from .grid import Run
from .journal import JournalError
from .options import SweepOptions
from .protocol import Task, Walk, walk
from .record import RecordError, check_header, check_record, check_same_sweep

RETRY_SECONDS = 2.0  # how often an unreachable database is tried again
MAX_STUDY_NAME = 512  # characters: Optuna's studies.study_name column
# The advisory lock held while Optuna creates its tables (once per database, whatever the study): its CREATE TYPE
# races where two machines join a new database together ("duplicate key ... pg_type_typname_nsp_index").
SCHEMA_LOCK_KEY = zlib.crc32(b"hf-geonorm sweep: Optuna's tables")
# SQLSTATEs of a connection the server dropped or cannot take yet (a restart): connection_exception (class 08),
# admin_shutdown, crash_shutdown, cannot_connect_now; a connection that breaks with no SQLSTATE is lost too
LOST_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise OptionError("--storage needs Optuna and a PostgreSQL driver: pip install 'hf-geonorm[distributed]'"
                          ) from None  # fmt: skip
    import warnings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # the heartbeat's
    return optuna


def shown_url(url: str) -> str:
    """The storage's URL with its password hidden, as messages name it."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def checked_url(url: str) -> str:
    """``url`` when it is a PostgreSQL URL that parses (a port that is a number in range, a host); ``OptionError``
    naming what is wrong otherwise, the password never shown."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if not url.startswith(("postgresql://", "postgresql+")):
        raise OptionError(f"--storage takes a PostgreSQL URL (postgresql://USER:PASSWORD@HOST:PORT/DATABASE); got "
                          f"{url.split(':', 1)[0]}:...")  # fmt: skip
    form = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as error:
        cause = "its port is not a number" if "invalid literal for int()" in str(error) else str(error).splitlines()[0]
        raise OptionError(f"--storage is not a valid URL ({cause}); give {form}") from None
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise OptionError(f"--storage {shown_url(url)}: port {parsed.port} is not one of 1 to 65535; give {form}")
    return url


def database_words(error: BaseException) -> str:
    """What the database (or its driver) said, in one line: the driver's error under SQLAlchemy's and Optuna's."""
    from sqlalchemy.exc import DBAPIError

    cause = _database_error(error)
    said = cause.orig if isinstance(cause, DBAPIError) and cause.orig is not None else (cause or error)
    return " ".join(" ".join(str(said).split("\n")[:2]).split()) or type(said).__name__


def _database_error(error: BaseException) -> BaseException | None:
    """The SQLAlchemy error ``error`` is or wraps (Optuna wraps some in its own), or None."""
    from sqlalchemy.exc import SQLAlchemyError

    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, SQLAlchemyError):
        seen = seen.__cause__ or seen.__context__
    return seen


def lost_connection(error: BaseException) -> bool:
    """Whether ``error`` is a connection to the database lost or refused while it restarts (the one error worth
    waiting out, once this machine has reached the database): an operational or interface error whose SQLSTATE is
    a connection's (``LOST_CONNECTION_STATES``) or none."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    cause = _database_error(error)
    if not isinstance(cause, (OperationalError, InterfaceError)):
        return False
    state = getattr(cause.orig, "sqlstate", None)
    return state is None or state.startswith(LOST_CONNECTION_STATES)


class StudyBoard:
    """The runs of a sweep in a shared study: what ``engine`` asks of a board (``take``, ``finish``, ``release``,
    ``entries``, ``walk``, ``beat``)."""

    def __init__(self, url: str, study: str, takeover_after: float, sweep: SweepOptions,
                 grids: dict[str, tuple[float, ...]], log: Callable[[str], None]) -> None:  # fmt: skip
        optuna = _optuna()
        checked_url(url)
        if len(study) > MAX_STUDY_NAME:
            raise OptionError(f"--study is {len(study):,} characters long; the study's name is stored in at most "
                              f"{MAX_STUDY_NAME}: give a shorter one")  # fmt: skip
        import sqlalchemy
        from sqlalchemy.pool import NullPool

        self.optuna, self.log = optuna, log
        self.where = f"study {study!r} in {shown_url(url)}"
        self.takeover_after, self.beat_every = takeover_after, max(1.0, takeover_after / 5)
        self.lock_key = zlib.crc32(f"hf-geonorm sweep {study}".encode())
        self.lock_engine = sqlalchemy.create_engine(url, poolclass=NullPool)
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.mine: dict[tuple, int] = {}  # the runs this machine trains: their trials
        self.beaten = 0.0
        self.sweep, self.grids = sweep, grids
        self.header: dict[str, Any] = {}  # the study's, once this machine has joined it (``join``)
        self.reached = False  # whether a step has reached the database: after that, a lost connection is waited out

        def opened() -> tuple[Any, Any]:
            with self.locked(SCHEMA_LOCK_KEY):  # machines starting together would each create Optuna's tables
                storage = optuna.storages.RDBStorage(url, heartbeat_interval=int(self.beat_every),
                                                     grace_period=int(takeover_after),
                                                     engine_kwargs={"pool_pre_ping": True})  # fmt: skip
                return storage, optuna.create_study(study_name=study, storage=storage, direction="minimize",
                                                    load_if_exists=True)  # fmt: skip

        self.storage, self.study = self.retrying("open", opened)
        self.study_id = self.storage.get_study_id_from_name(study)

    def retrying(self, what: str, step: Callable[[], Any]) -> Any:
        """``step``, tried again while the connection to the database is lost (a restart: ``lost_connection``),
        ``--takeover-after`` seconds at least; then a one-line error. Any other error of the database, and one
        that keeps this machine from reaching it the first time, is a one-line error at once, in its words."""
        from sqlalchemy.exc import SQLAlchemyError

        deadline, said = time.monotonic() + max(self.takeover_after, 30.0), False
        while True:
            try:
                result = step()
                self.reached = True
                return result
            except (SQLAlchemyError, self.optuna.exceptions.StorageInternalError) as error:
                words = database_words(error)
                if not lost_connection(error):
                    raise JournalError(f"{self.where}: {what} failed: {words}") from None
                if not self.reached:  # a closed port, an unknown host, a refused login: the driver's words say
                    raise JournalError(f"cannot connect to {self.where}: {words}") from None
                if time.monotonic() > deadline:
                    raise JournalError(f"{self.where} cannot be reached ({what}): {words}; the runs finished are kept "
                                       "there: run the sweep again once it is back") from None  # fmt: skip
                if not said:
                    self.log(f"{self.where} cannot be reached ({what}); trying again every {RETRY_SECONDS:g} s")
                    said = True
                time.sleep(RETRY_SECONDS)

    @contextmanager
    def locked(self, key: int | None = None) -> Any:
        """An advisory lock, the study's by default: one machine at a time reads the protocol and takes a run."""
        import sqlalchemy
        from sqlalchemy.exc import DBAPIError

        key = self.lock_key if key is None else key
        with self.lock_engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            try:
                yield
            finally:
                with suppress(DBAPIError):  # a connection lost (a restart) has released its lock already
                    connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": key})

    def join(self, header: dict[str, Any], grid: dict[str, Any], identity: dict[str, Any]) -> dict[str, Any]:
        """Record the sweep's header and grid in a new study; compare a study's that has them with this machine's
        ``identity`` (measured here) and grid, before this machine trains anything; the study's header."""

        def step() -> tuple[Any, Any]:
            with self.locked():
                attrs = self.storage.get_study_user_attrs(self.study_id)
                if "header" not in attrs:
                    self.storage.set_study_user_attr(self.study_id, "grid", grid)
                    self.storage.set_study_user_attr(self.study_id, "header", header)
                    return header, grid
                return attrs["header"], attrs.get("grid")

        stored, stored_grid = self.retrying("join", step)
        try:
            check_header(stored, where=f"{self.where}, its header")
            check_same_sweep(stored, identity, where=f"{self.where}, its header")
        except RecordError as error:
            raise JournalError(f"{error} (expected: the study's, found: this machine's); every machine of a sweep "
                               "trains the same options on the same data, tokenizer and model: give those, or "
                               "another --study") from None
        stored_grid = stored_grid if isinstance(stored_grid, dict) else {}
        changed = [f"{name} {stored_grid.get(name)!r} there, {grid.get(name)!r} here" for name in sorted(grid)
                   if stored_grid.get(name) != grid.get(name)]  # fmt: skip
        if changed:
            raise JournalError(f"{self.where} holds a sweep of another grid ({'; '.join(changed)}): every machine of "
                               "a sweep runs the same grid; give the options it was started with, or another --study")
        self.header = stored
        return stored

    def trials(self, *states: Any) -> list[Any]:
        return self.storage.get_all_trials(self.study_id, deepcopy=False, states=states or None)

    def entries(self) -> list[dict[str, Any]]:
        """The finished runs: each COMPLETE trial's entry, the first of a run's should two exist; each checked against
        the study's header (``record.check_record``: refused naming its trial and field)."""
        found: dict[str, dict[str, Any]] = {}
        complete = self.optuna.trial.TrialState.COMPLETE
        for trial in sorted(self.retrying("read", lambda: self.trials(complete)), key=lambda t: t.number):
            entry = trial.user_attrs.get("entry")
            try:
                check_record(entry, self.header, where=f"{self.where}, trial {trial.number}")
            except RecordError as error:
                raise JournalError(f"{error}: not a run of this sweep, so it cannot count; remove that trial from "
                                   "the study, or give another --study") from None
            if entry["run"] not in found:
                found[entry["run"]] = entry
        return list(found.values())

    def walk(self) -> Walk:
        return walk(self.sweep, self.grids, self.entries())

    def take(self) -> Task | None:
        """The next run the protocol needs that no machine has finished or is training, its trial created RUNNING
        with a first heartbeat; None when every such run is taken (or waits on a result not in yet)."""
        optuna = self.optuna
        state = optuna.trial.TrialState

        token = uuid.uuid4().hex  # names this attempt's trial, should a lost connection make it try again

        def step() -> Task | None:
            with self.locked():
                optuna.storages.fail_stale_trials(self.study)  # machines silent for --takeover-after: their runs
                running = self.trials(state.RUNNING)
                made = [t for t in running if t.user_attrs.get("take") == token]  # before the connection was lost
                if made:
                    key = tuple(made[0].user_attrs["key"])
                    self.mine[key] = self.storage.get_trial_id_from_study_id_trial_number(self.study_id,
                                                                                          made[0].number)  # fmt: skip
                    self.storage.record_heartbeat(self.mine[key])
                    return Task(Run(*key), made[0].user_attrs["role"])
                task = self.walk().next_due({tuple(t.user_attrs["key"]) for t in running if "key" in t.user_attrs})
                if task is None:
                    return None
                key = task.run.key()
                attrs = {"key": list(key), "run": task.run.name, "role": task.role, "worker": self.worker,
                         "take": token}  # fmt: skip
                trial = optuna.trial.create_trial(state=state.RUNNING, user_attrs=attrs)
                self.mine[key] = self.storage.create_new_trial(self.study_id, template_trial=trial)
                self.storage.record_heartbeat(self.mine[key])
                return task

        return self.retrying("take a run", step)

    def beat(self) -> None:
        """A heartbeat for each run this machine trains, every fifth of ``--takeover-after``."""
        if time.monotonic() - self.beaten < self.beat_every:
            return
        self.beaten = time.monotonic()
        for trial_id in list(self.mine.values()):
            self.retrying("heartbeat", lambda trial_id=trial_id: self.storage.record_heartbeat(trial_id))

    def finish(self, task: Task, entry: dict[str, Any]) -> bool:
        """The run's entry and its trial COMPLETE; False (and the result dropped) where another machine took the run
        over meanwhile (this one was silent past ``--takeover-after``)."""
        trial_id = self.mine.pop(task.run.key())
        state = self.optuna.trial.TrialState
        loss = math.inf if entry["val_loss"] is None else entry["val_loss"]

        def step() -> None:
            self.storage.set_trial_user_attr(trial_id, "entry", json.loads(json.dumps(entry, allow_nan=False)))
            self.storage.set_trial_state_values(trial_id, state.COMPLETE, values=[loss])

        try:
            self.retrying("record a run", step)
        except self.optuna.exceptions.UpdateFinishedTrialError:
            if self.storage.get_trial(trial_id).state == state.COMPLETE:
                return True  # recorded, the answer lost with the connection
            self.log(f"{task.run.label}: taken over by another machine while this one was silent past "
                     "--takeover-after; this result is dropped (the other machine's counts)")  # fmt: skip
            return False
        return True

    def release(self, task: Task) -> None:
        """A run this machine stopped: its trial FAIL, so that the next machine that looks takes it."""
        trial_id = self.mine.pop(task.run.key(), None)
        if trial_id is None:
            return
        state = self.optuna.trial.TrialState
        try:
            self.retrying("release a run", lambda: self.storage.set_trial_state_values(trial_id, state.FAIL))
        except self.optuna.exceptions.UpdateFinishedTrialError:
            pass  # already failed as stale
