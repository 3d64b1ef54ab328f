"""Which text validation and test hold out (``held_out_plan``), decided before any block is packed, the same for
the cached and the streamed data.

The units held out, by the held-out rule (``options.HELD_OUT_RULE``; a sweep, run or cache begun under rule 1
keeps it):

- a folder of text files (or the standard library's, the default): whole files (``corpus.by_files``), none of
  whose text ever trains. The files are ranked by the SHA-256 of their content (``corpus.candidate_files``):
  validation's candidates are ranks 0, 20, 40, ..., test's ranks 10, 30, 50, ... (the middle one of fewer than 20).
  Each split takes its candidates in that order until it holds ``--eval-blocks`` blocks' worth of tokens (its
  budget): the pieces of a taken file up to the budget are held out, its other pieces (those of the file that fills
  the budget) neither train nor are evaluated (``PAST``). A candidate longer than the budget is taken too unless it
  is more than a twentieth of the data's bytes (``LONGEST_SHARE``): that one trains, so that one long file never
  takes much of the training text with it.
- the same under the rule before (``LEGACY_HELD_OUT_RULE``, kept by the sweeps, runs and caches begun under it):
  candidates in path order, each taken whole while its split holds fewer than its budget, and a candidate longer
  than the budget never held out (it trains), so that validation could hold far less than its budget.
- any other data (a single text file, tables of rows, a ``datasets`` corpus): documents (pieces of a text file,
  rows), by the same rule over their numbers; a document longer than the evaluation is cut: the tokens the
  evaluation needs are held out, the rest of it trains.
- a folder of too few files: where whole files give a split no block (fewer than ``MIN_FILES`` files, or each
  candidate file too long to be held out), its documents, with a warning that says why (``why_not_files``).

Near-duplicates (``duplicates.TrainingOverlap``): the candidates are read in order until each split has ``POOL``
times the tokens it evaluates; the rest of the corpus, which trains, is read once against them, and a candidate
piece at least half of whose word 5-grams training holds is removed from the held-out side (under rule 2, a split of
files that this leaves short of its budget reads twice as many candidates, and the corpus is read against them
again, until the split holds its budget or has no candidate left, before it would keep near-duplicates). A removed
document trains; a removed piece of a held-out file neither trains nor is evaluated (its file is held out whole),
and a candidate file all of whose pieces are removed is not held out (it trains). The pieces of candidates left to
training count as training too, and so do the pieces of a long candidate beyond those read (whether it trains or
not: a held-out piece like one of them is removed either way). A split that removal would leave without a block
keeps its near-duplicates, with a warning (the data repeats itself).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..options import HELD_OUT_RULE, LEGACY_HELD_OUT_RULE
from .corpus import MIN_FILES, TEST, VAL, VAL_EVERY, Corpus, by_files, candidate_files, candidate_split
from .duplicates import TrainingOverlap
from .token_batches import encode_documents, end_of_text, text_batches

POOL = 2  # the candidates read: twice each split's evaluation, so that removing duplicates leaves enough
DROPPED = 3  # the code of a removed piece of a held-out file
PAST = 4  # the code of a piece of a held-out file past its split's budget: it neither trains nor is evaluated
LONGEST_SHARE = 1 / VAL_EVERY  # the largest share of the data's bytes a file longer than the budget may withhold
SPLIT_NAMES = {VAL: "validation", TEST: "test"}
Key = tuple[int, int]  # (shard, document of the shard)


@dataclass
class _Unit:
    """A candidate: a file (its documents) or one document, with each document's text and token ids; ``rest``:
    the first document of a long file that was not read (None: read whole)."""

    split: int
    keys: list[Key]
    texts: list[str]
    ids: list[np.ndarray]
    rest: int | None = None


@dataclass
class HeldOutPlan:
    """What validation and test hold out under the held-out ``rule``: by ``files`` or by documents (and
    ``why_not_files`` of a folder held out by documents); ``held``: for each document held out, removed or past its
    split's budget, by its number in corpus order, its code (``VAL``, ``TEST``, ``DROPPED`` or ``PAST``) and how many
    of its first tokens a split takes (the rest trains; a removed or past document does not train at all); the
    token ids of the held-out documents; and per split the files held out, the pieces removed as near-duplicates,
    and whether its near-duplicates were kept (removing them left no block)."""

    rule: int
    files: bool
    documents: int
    shard_starts: list[int]
    held: dict[int, tuple[int, int]] = field(default_factory=dict)
    ids: dict[int, np.ndarray] = field(default_factory=dict)
    held_files: dict[int, int] = field(default_factory=lambda: {VAL: 0, TEST: 0})
    removed: dict[int, int] = field(default_factory=lambda: {VAL: 0, TEST: 0})
    duplicates_kept: dict[int, bool] = field(default_factory=lambda: {VAL: False, TEST: False})
    why_not_files: str | None = None

    def key(self, number: int) -> Key:
        """The (shard, document) of document ``number``."""
        shard = bisect.bisect_right(self.shard_starts, number) - 1
        return shard, number - self.shard_starts[shard]

    def split_ids(self, code: int) -> list[int]:
        """The tokens split ``code`` holds out, its documents in corpus order."""
        return [t for n, (c, kept) in sorted(self.held.items()) if c == code for t in self.ids[n][:kept].tolist()]


def held_out_plan(corpus: Corpus, tokenizer: Any, seq_len: int, eval_blocks: int,
                  rule: int = HELD_OUT_RULE) -> HeldOutPlan:  # fmt: skip
    """The plan of the module's held-out ``rule`` for ``corpus``, its token counts by ``tokenizer``, each split
    evaluating ``eval_blocks`` blocks of ``seq_len`` tokens. Under rule 2 a split of files that its near-duplicates
    leave short of its budget (or keeping them) reads twice as many candidates, and the data is read against them
    again, until it holds its budget or its candidates are all read. ``ValueError`` when the data holds fewer than
    three documents."""
    budget, eos = eval_blocks * seq_len, end_of_text(tokenizer)
    files, why_not = by_files(corpus), None
    reach = {VAL: POOL, TEST: POOL}
    pool = _file_pool(corpus, tokenizer, eos, budget, rule, reach) if files else None
    if files and (short := [s for s in (VAL, TEST) if _tokens(pool[s]) < seq_len]):
        files, pool = False, None
        larger = "" if rule == LEGACY_HELD_OUT_RULE else " and larger than a twentieth of the data"
        why_not = (f"whole files give {' and '.join(SPLIT_NAMES[s] for s in short)} less than a block of --seq-len "
                   f"{seq_len} (candidate files longer than the {budget:,} tokens of --eval-blocks {eval_blocks} x "
                   f"--seq-len {seq_len}{larger} are never held out whole)")  # fmt: skip
    elif not files and sum(kind == "file" for kind, _ in corpus.shards) == len(corpus.shards) > 1:
        why_not = f"the data holds {len(corpus.shards)} files, and whole files are held out of {MIN_FILES} at least"
    if pool is None:
        pool = _document_pool(corpus, tokenizer, eos, budget)
    while True:
        plan = _planned(corpus, pool, HeldOutPlan(rule, files, 0, [], why_not_files=why_not), budget, seq_len)
        short = [s for s in (VAL, TEST)
                 if plan.duplicates_kept[s] or sum(kept for code, kept in plan.held.values() if code == s) < budget]
        if not (files and rule != LEGACY_HELD_OUT_RULE and short):
            return plan
        reach = {split: times * 2 if split in short else times for split, times in reach.items()}
        wider = _file_pool(corpus, tokenizer, eos, budget, rule, reach)
        if all(_tokens(wider[split]) == _tokens(pool[split]) for split in short):
            return plan  # every candidate of the short splits is read
        pool = wider


def _tokens(units: list[_Unit]) -> int:
    return sum(len(ids) for unit in units for ids in unit.ids)


def _planned(corpus: Corpus, pool: dict[int, list[_Unit]], plan: HeldOutPlan, budget: int,
             seq_len: int) -> HeldOutPlan:  # fmt: skip
    """``plan`` filled from the candidates ``pool``: the data read once against them (``TrainingOverlap``), then
    ``_select``."""
    candidates = {key: text for units in pool.values() for unit in units
                  for key, text in zip(unit.keys, unit.texts, strict=True)}  # fmt: skip
    overlap = TrainingOverlap(candidates)
    for shard in range(len(corpus.shards)):
        plan.shard_starts.append(plan.documents)
        for index, text in enumerate(corpus.documents(shard)):
            if (shard, index) not in candidates:
                overlap.add_training(text)
            plan.documents += 1
    if plan.documents < 3:
        raise ValueError(
            f"the data holds {plan.documents} document(s): validation and test hold out whole documents (one in "
            f"{VAL_EVERY} each), so training needs at least three; give more text"
        )
    _select(plan, pool, overlap, budget, seq_len)
    return plan


def _numbered(corpus: Corpus) -> Iterator[tuple[Key, str]]:
    for shard in range(len(corpus.shards)):
        yield from (((shard, index), text) for index, text in enumerate(corpus.documents(shard)))


def _encoded(texts: list[str], tokenizer: Any, eos: list[int]) -> list[np.ndarray]:
    ids, lengths = encode_documents(texts, tokenizer, eos)
    return np.split(ids, np.cumsum(lengths)[:-1])


def _file_pool(corpus: Corpus, tokenizer: Any, eos: list[int], budget: int, rule: int,
               reach: dict[int, int]) -> dict[int, list[_Unit]]:  # fmt: skip
    """The candidate files in the order the splits take them (``candidate_files``), until each split has ``reach``
    times ``budget`` tokens; only these files are read. A file longer than ``budget`` tokens is read until its
    split has them (its ``rest`` unread) where it may be held out; where it may not (under the legacy rule, or when
    it is more than ``LONGEST_SHARE`` of the data's bytes) it is read no further than ``budget`` and left to
    train."""
    pool: dict[int, list[_Unit]] = {VAL: [], TEST: []}
    size = {VAL: 0, TEST: 0}
    longest = LONGEST_SHARE * sum(length for length, _ in corpus.contents)
    for shard, split in candidate_files(corpus, rule):
        if size[split] >= reach[split] * budget:
            continue
        long_held = rule != LEGACY_HELD_OUT_RULE and corpus.contents[shard][0] <= longest
        unit, tokens = _Unit(split, [], [], []), 0
        for texts in text_batches(corpus.documents(shard)):
            ids = _encoded(texts, tokenizer, eos)
            unit.keys += [(shard, len(unit.keys) + n) for n in range(len(texts))]
            unit.texts += texts
            unit.ids += ids
            tokens += sum(map(len, ids))
            if tokens > budget and not long_held:
                break
            if long_held and size[split] + tokens >= reach[split] * budget:
                unit.rest = len(unit.keys)
                break
        if unit.keys and (tokens <= budget or long_held):
            pool[split].append(unit)
            size[split] += tokens
    return pool


def _document_pool(corpus: Corpus, tokenizer: Any, eos: list[int], budget: int) -> dict[int, list[_Unit]]:
    """The candidate documents, in order, until each split has ``POOL`` times ``budget`` tokens (the corpus is
    read that far: its first ``VAL_EVERY`` documents fix the test offset of a small corpus)."""
    pool: dict[int, list[_Unit]] = {VAL: [], TEST: []}
    size = {VAL: 0, TEST: 0}
    documents = _numbered(corpus)
    head = list(itertools.islice(documents, VAL_EVERY))
    for number, (key, text) in enumerate(itertools.chain(head, documents)):
        split = candidate_split(number, len(head))
        if split and size[split] < POOL * budget:
            [ids] = _encoded([text], tokenizer, eos)
            pool[split].append(_Unit(split, [key], [text], [ids]))
            size[split] += len(ids)
        if min(size.values()) >= POOL * budget:
            break
    return pool


def _select(plan: HeldOutPlan, pool: dict[int, list[_Unit]], overlap: TrainingOverlap, budget: int, seq_len: int):
    """Fill ``plan``: each split's candidates in order while it holds fewer than ``budget`` tokens, without their
    near-duplicates in training; then without those of the candidates left to training; a split that this leaves
    without a block keeps its near-duplicates. The unread rest of a long file held out is ``PAST``."""
    ids = {key: i for units in pool.values() for unit in units for key, i in zip(unit.keys, unit.ids, strict=True)}
    duplicate = {key: overlap.duplicate(key) for key in ids}
    past = plan.files and plan.rule != LEGACY_HELD_OUT_RULE  # pieces past the budget neither train nor are evaluated
    held: dict[Key, tuple[int, int]] = {}
    removed: dict[int, set[Key]] = {}
    for split in (VAL, TEST):
        taken, removed[split] = _take(pool[split], duplicate, plan.files, budget, past)
        held |= taken
    training = [key for key in ids if key not in held]
    for key, (code, _) in list(held.items()):
        if code in SPLIT_NAMES and overlap.duplicate(key, training):
            removed[code].add(key)
            if plan.files:
                held[key] = (DROPPED, len(ids[key]))
            else:
                del held[key]
    for split in (VAL, TEST):
        if removed[split] and sum(kept for code, kept in held.values() if code == split) < seq_len:
            own = {key for unit in pool[split] for key in unit.keys}
            held = {key: value for key, value in held.items() if key not in own} | _take(pool[split], {}, plan.files,
                                                                                        budget, past)[0]  # fmt: skip
            plan.duplicates_kept[split], removed[split] = True, set()
        plan.removed[split] = len(removed[split])
        if plan.files:
            plan.held_files[split] = len({key[0] for key, (code, _) in held.items() if code == split})
    number = {key: plan.shard_starts[key[0]] + key[1] for key in held}
    plan.held = {number[key]: value for key, value in held.items()}
    plan.ids = {number[key]: ids[key] for key, (code, _) in held.items() if code in SPLIT_NAMES}
    ends = [*plan.shard_starts[1:], plan.documents]
    for unit in (unit for units in pool.values() for unit in units if unit.rest is not None and unit.keys[0] in held):
        shard = unit.keys[0][0]
        plan.held |= dict.fromkeys(range(plan.shard_starts[shard] + unit.rest, ends[shard]), (PAST, 0))


def _take(
    units: list[_Unit], duplicate: dict[Key, bool], files: bool, budget: int, past: bool
) -> tuple[dict[Key, tuple[int, int]], set[Key]]:
    """The documents a split takes of its candidates ``units``: in order while it holds fewer than ``budget``
    tokens, without the ``duplicate`` ones (dropped from a file held out, else left to train); and those removed.
    With ``past``, the pieces of a file taken that come after the split holds its budget are ``PAST``."""
    held: dict[Key, tuple[int, int]] = {}
    removed: set[Key] = set()
    before = 0
    for unit in units:
        if before >= budget:
            break
        kept = [not duplicate.get(key, False) for key in unit.keys]
        if not any(kept):
            removed |= set(unit.keys)
            continue
        for key, ids, keep in zip(unit.keys, unit.ids, kept, strict=True):
            size = len(ids)
            if past and before >= budget:
                held[key] = (PAST, size)
            elif not keep:
                removed.add(key)
                held[key] = (DROPPED, size)
            elif files or size <= budget:
                held[key] = (unit.split, size)
            else:  # a document longer than the whole evaluation: only what it still needs
                held[key] = (unit.split, budget - before)
            before += size if keep else 0
    return held, removed
