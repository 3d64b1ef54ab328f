"""The sweep's identity measured before each run (``record``: what it is, how it is stored and checked): the data's
source resolved as a run resolves it (its fingerprint and its tokenizer's), the ``--model`` folder's fingerprint and
the settings the runs share, compared with the journal's header (or written into a new one); and each run's line
checked before it is appended, so that a file changed while a run trained never mixes into the journal."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import first_line
from ..training.data.prepare import data_request, data_source, training_data
from ..training.options import TrainOptions
from .journal import Journal, JournalError, begin_journal, check_identity, load_journal
from .record import record_problem, sweep_header, sweep_identity
from .reference import held_out_record, read_held_out, write_held_out


def measured_identity(train: TrainOptions) -> tuple[dict[str, Any], Callable[[Any], dict[str, Any] | None]]:
    """The sweep's identity as measured now (``record.sweep_identity``: the data's source resolved as a run resolves
    it), and what tokenizes and caches that data (given the log), so that the first run reads it as every other does
    and the time estimate measures runs alike (a stream is read by each run alike: nothing to do); that returns the
    held-out text's sizes and unigram reference (``reference.held_out_record``)."""
    started = time.monotonic()
    request = data_request(train)
    source = data_source(request, lambda _: None)
    identity = sweep_identity(replace(train, lr=None), source.corpus.fingerprint, source.tokenizer_hash)

    def prepare(log: Any) -> dict[str, Any] | None:
        if train.streaming:
            return None
        log("preparing the data before the first run: tokenizing and caching it as every run reads it (a tokenizer "
            "trained on the fly, the held-out documents chosen)")  # fmt: skip
        data = training_data(source, request, lambda _: None)
        log(f"data prepared in {time.monotonic() - started:.0f} s, before the first run: tokenized and cached, "
            "as every run reads it")  # fmt: skip
        return held_out_record(data, source.corpus.fingerprint)

    return identity, prepare


def checked_identity(journal: Journal, train: TrainOptions, plan: dict[str, Any], prepare: bool,
                     log: Any) -> tuple[Journal, dict[str, Any]]:  # fmt: skip
    """The journal (begun here when it has no header: its ``plan`` the sweep options given) and the sweep's
    identity as measured now, refused where it differs from the header's (``journal.check_identity``). With
    ``prepare`` (before the first run), the data is also tokenized and cached (``measured_identity``)."""
    identity, prepare_data = measured_identity(train)
    if journal.header is None:
        begin_journal(journal.path, sweep_header(identity, plan))
        journal = load_journal(journal.path)
    else:
        check_identity(journal, replace(train, lr=None), identity)
    if prepare:
        write_held_out(journal.path.parent, prepare_data(log), log)
    return journal, identity


def reference_for_finished(journal: Journal, train: TrainOptions, plan: dict[str, Any], log: Any) -> None:
    """A finished sweep without its unigram reference (an earlier hf-geonorm wrote none): measured now from the
    journal's data. Where the data is no longer the journal's, the report goes without it and the log says why (the
    journal's runs still make the report, as they did)."""
    if train.streaming or read_held_out(journal.path.parent, journal.header) is not None:
        return
    try:
        checked_identity(journal, train, plan, True, log)
    except ValueError as error:  # the data changed, or cannot be read as the sweep read it
        log(f"warning: the report goes without its unigram reference row: {first_line(error)}")


def checked_line(journal: Journal, label: str, entry: dict[str, Any], identity: dict[str, Any]) -> dict[str, Any]:
    """The journal line of the run ``label``: its result with the fingerprints checked before it trained, if that
    is a run of this sweep (``record.check_record``: the data its run read included); else the error that says what
    changed while it trained."""
    entry = {**entry, "fingerprints": identity["fingerprints"]}
    problem = record_problem(entry, journal.header or {})
    if problem is not None:
        raise JournalError(
            f"run {label} is not recorded in {journal.path}: its record is not one of this sweep ({problem}), so the "
            "data, the tokenizer or the model changed while it trained; run the sweep again on the files it began "
            "with, or give another --output"
        )
    return entry
