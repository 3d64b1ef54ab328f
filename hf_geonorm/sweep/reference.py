"""What a sweep's held-out text is measured against, written once before the first run into ``DIR/held_out.json``:
its size (a validation split too small to choose on is said on the console then, not only in the runs' logs) and
the unigram cross-entropy of its evaluated blocks, the loss of the best model that ignores the context (each
target token, every token of a block but its first, under the training targets' frequencies, add-one smoothed).
The report puts it beside the arms as a reference row, and an arm within ``NOT_LEARNING`` of it has not yet learned
from the context."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..training.data.pipeline import ArrowBlocks

HELD_OUT = "held_out.json"
NOT_LEARNING = 0.1  # an arm whose loss is within this of the unigram reference learned (almost) nothing of the context
MIN_VAL_DOCUMENTS = 100
MIN_VAL_TOKENS = 65_536


def target_counts(blocks: Any, vocab: int) -> np.ndarray:
    """How often each token id is a target (every token of a block but its first) in ``blocks``."""
    if isinstance(blocks, ArrowBlocks):
        return sum((np.bincount(view[:, 1:].reshape(-1), minlength=vocab) for view in blocks.views),
                   np.zeros(vocab, dtype=np.int64))  # fmt: skip
    return np.bincount(np.asarray(blocks.blocks)[:, 1:].reshape(-1), minlength=vocab)


def held_out_record(data: Any, fingerprint: str) -> dict[str, Any] | None:
    """The held-out sizes and the unigram cross-entropy of the validation and test blocks evaluated (``data``: a
    ``prepare.TrainingData`` of cached blocks); None for streamed data, whose training tokens are not at hand."""
    if not isinstance(data.train, ArrowBlocks):
        return None
    vocab = max(len(data.tokenizer), 1)
    train = target_counts(data.train, vocab).astype(np.float64) + 1.0
    log_frequency = np.log(train / train.sum())
    record: dict[str, Any] = {"data": fingerprint}
    for split, blocks in (("validation", data.val), ("test", data.test)):
        counts = target_counts(blocks, vocab)
        record[f"unigram_{split}"] = float(-(counts * log_frequency).sum() / counts.sum()) if counts.sum() else None
    for name in ("val_documents", "val_tokens", "test_documents", "test_tokens"):
        record[name] = data.facts.get(name)
    return record


def too_small(record: dict[str, Any]) -> str | None:
    """The warning for a validation split too small to choose on, None where it is large enough."""
    documents, tokens = record.get("val_documents"), record.get("val_tokens")
    if documents is None or (documents >= MIN_VAL_DOCUMENTS and tokens >= MIN_VAL_TOKENS):
        return None
    return (f"validation holds {documents:,} documents ({tokens:,} tokens), fewer than {MIN_VAL_DOCUMENTS} documents "
            f"or {MIN_VAL_TOKENS:,} tokens: too few to choose between rates and arms a few hundredths apart (another "
            "sample of held-out documents could reorder them); raise --eval-blocks (held-out documents are taken "
            "until they fill that many blocks) and give more documents (at most one in twenty is held out for each "
            "split)")  # fmt: skip


def write_held_out(folder: Path, record: dict[str, Any] | None, log: Any) -> None:
    """``DIR/held_out.json`` (replaced: the data it describes is the journal's), and the size warning on the log."""
    if record is None:
        return
    warning = too_small(record)
    if warning is not None:
        log(f"warning: {warning}")
    from ..training.run.outputs import replace_file

    replace_file(folder / HELD_OUT, lambda tmp: tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8"))


def read_held_out(folder: Path, header: dict[str, Any] | None) -> dict[str, Any] | None:
    """``DIR/held_out.json`` where it describes the journal's data (its fingerprint the header's), else None."""
    path = folder / HELD_OUT
    if header is None or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    marks = header.get("fingerprints")
    if not isinstance(record, dict) or not isinstance(marks, dict) or record.get("data") != marks.get("data"):
        return None
    value = record.get("unigram_test")
    return record if isinstance(value, (int, float)) and math.isfinite(value) else None

