"""`hf-geonorm train`'s data pipeline (hf_geonorm.training.data.corpus, pipeline, prepare): every token of the data is
trained on unless --max-tokens says otherwise, the tokenized blocks are cached and reused, validation is held out by
documents, JSON lines and parquet, --streaming, and --resume in the middle of an epoch.

The expected blocks are computed from the documented rules (``helpers.reference_blocks``), with the saved tokenizer."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from hf_geonorm.training.data.corpus import resolve_corpus
from hf_geonorm.training.data.pipeline import ArrowBlocks, streaming_blocks, streaming_holdout
from hf_geonorm.training.run import trainer as trainer_module

from support.helpers import (
    STDLIB,
    held_out,
    logged,
    marked_text,
    reference_blocks,
    reference_documents,
    train,
    train_in,
    words,
)

SMALL = ["--seq-len", "64", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--max-steps", "2",
         "--eval-every", "2", "--preset", "tiny"]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "marked.txt"
    path.write_text(marked_text(2_000_000), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture
def seen(monkeypatch) -> list[list[list[int]]]:
    """The input_ids of every training step, as the model gets them."""
    batches: list[list[list[int]]] = []
    step = trainer_module.CheckedTrainer.training_step

    def recorded(self, model, inputs, *args, **kwargs):
        batches.append(inputs["input_ids"].tolist())
        return step(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(trainer_module.CheckedTrainer, "training_step", recorded)
    return batches


def test_all_tokens_train_the_cache_is_reused_and_max_tokens_caps(tmp_path, corpus, seen):
    """(1) every token of the file but the validation documents' trains; (2) a second run reads the same blocks
    from the cache, and a build with two processes writes the same blocks; --max-tokens caps with a message."""
    cache = tmp_path / "cache"
    first = train("--data", str(corpus), *SMALL, "--data-cache", str(cache), "--output", str(tmp_path / "a"))
    assert first.exit_code == 0, first.output
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "a" / "final")
    train_blocks, _, total, held = reference_blocks(tokenizer, reference_documents(corpus.read_text()), 64)
    assert logged(first.output, r"([\d,]+) tokens \(an end-of-text token after each document\)") == total
    trained = logged(first.output, r"training on ([\d,]+) tokens")
    assert trained == len(train_blocks) * 64 and abs(trained - (total - held)) <= 0.01 * (total - held)
    assert "training a byte-level BPE tokenizer (300 tokens) on all of its training documents" in first.output
    assert "tokenized in" in first.output and "read from the cache" not in first.output
    [folder] = cache.glob("blocks-*")
    assert [b.tolist() for b in ArrowBlocks(folder / "train.arrow", 64).views[0][:3]] == train_blocks[:3]
    second = train("--data", str(corpus), *SMALL, "--data-cache", str(cache), "--output", str(tmp_path / "b"))
    assert second.exit_code == 0, second.output
    assert "read from the cache" in second.output and "trained on this data before" in second.output
    assert seen[2:] == seen[:2]  # the same seed draws the same blocks
    two = tmp_path / "cache2"
    two.mkdir()
    (two / next(cache.glob("tokenizer-*")).name).write_bytes(next(cache.glob("tokenizer-*")).read_bytes())
    capped = train("--data", str(corpus), *SMALL, "--data-cache", str(two), "--data-workers", "2",
                   "--max-tokens", "10000", "--output", str(tmp_path / "c"))  # fmt: skip
    assert capped.exit_code == 0, capped.output
    assert (two / folder.name / "train.arrow").read_bytes() == (folder / "train.arrow").read_bytes()
    assert logged(capped.output, r"training on ([\d,]+) tokens") == 10000 // 64 * 64
    assert "--max-tokens 10,000" in capped.output and f"the first of its {len(train_blocks) * 64:,}" in capped.output


def test_validation_documents_never_appear_in_training_blocks(tmp_path, corpus):
    """(3) decoded, the training blocks hold none of the validation documents' paragraph markers, and every other
    marker but those of the dropped tail."""
    cache = tmp_path / "cache"  # built by this run, so its timings are this run's
    started = time.perf_counter()
    result = train("--data", str(corpus), *SMALL, "--data-cache", str(cache), "--output", str(tmp_path / "run"))
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "final")
    docs = reference_documents(corpus.read_text())
    _, val_blocks, _, _ = reference_blocks(tokenizer, docs, 64)
    lengths = [len(tokenizer(doc)["input_ids"]) + 1 for doc in docs]
    val_docs = held_out(lengths, 0, 64 * 64)
    test_docs = held_out(lengths, 10, 64 * 64)
    assert logged(result.output, r"validation: ([\d,]+) documents") == len(val_docs)
    assert logged(result.output, r"test: ([\d,]+) documents") == len(test_docs)
    assert logged(result.output, r"validation: [\d,]+ documents, ([\d,]+) tokens") == sum(lengths[i] for i in val_docs)
    folder = next(p for p in cache.glob("blocks-*") if (p / "meta.json").is_file())
    timings = {k: v for k, v in json.loads((folder / "meta.json").read_text()).items() if k.endswith("_seconds")}
    # the stages' timings of the build this run made (the cache is this test's own): within the run's wall time
    assert len(timings) == 4 and all(v >= 0 for v in timings.values()) and sum(timings.values()) <= elapsed, timings
    blocks = ArrowBlocks(folder / "train.arrow", 64)
    text = tokenizer.decode([t for view in blocks.views for t in view.ravel().tolist()])
    held = set(val_docs + test_docs)
    val_markers = {m for i in held for m in re.findall(r"#@ \d{6}", docs[i])}
    train_markers = {m for i, d in enumerate(docs[:-1]) if i not in held for m in re.findall(r"#@ \d{6}", d)}
    found = set(re.findall(r"#@ \d{6}", text))
    assert val_markers and not val_markers & found  # neither validation's nor test's documents train
    assert train_markers <= found
    val = [b.tolist() for view in ArrowBlocks(folder / "val.arrow", 64).views for b in view]
    assert val[: len(val_blocks)] == val_blocks and len(val_blocks) == 64


def test_jsonl_and_parquet_rows_are_the_documents(tmp_path, cache):
    """(4) a row's ``text`` is a document: the data's tokens are the rows' tokens and one end-of-text each."""
    rows = [p for p in (STDLIB / "textwrap.py").read_text().split("\n\n") if p.strip()] * 3
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": r, "id": i}) + "\n" for i, r in enumerate(rows)))
    pq.write_table(pa.table({"id": list(range(len(rows))), "text": rows}), tmp_path / "rows.parquet")
    for name in ("rows.jsonl", "rows.parquet"):
        out = tmp_path / name.replace(".", "_")
        result = train("--data", str(tmp_path / name), *SMALL, "--seq-len", "32", "--data-cache", str(cache),
                       "--output", str(out))  # fmt: skip
        assert result.exit_code == 0, result.output
        tokenizer = AutoTokenizer.from_pretrained(out / "final")
        _, _, total, held = reference_blocks(tokenizer, rows, 32)
        assert f"{len(rows):,} documents, {total:,} tokens" in result.output
        assert logged(result.output, r"training on ([\d,]+) tokens") == (total - held) // 32 * 32
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    bad = train("--data", str(tmp_path / "bad.jsonl"), *SMALL, "--data-cache", str(cache), "--output", str(out) + "x")
    assert bad.exit_code != 0 and "bad.jsonl, line 2: no 'text' string" in bad.output, bad.output
    assert "Traceback" not in bad.output


def test_streaming_trains_on_the_blocks_of_the_cached_pipeline(tmp_path, corpus, cache):
    """(5) for one file the stream's blocks are the cached blocks, in another order (validation too)."""
    result = train("--data", str(corpus), *SMALL, "--streaming", "--data-cache", str(cache),
                   "--output", str(tmp_path / "run"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "unknown in advance" in result.output
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "final")
    data = resolve_corpus(str(corpus))
    held_blocks, held, _ = streaming_holdout(data, tokenizer, 64, 64)
    val = held_blocks["val"]
    streamed = sorted(tuple(b["input_ids"]) for b in streaming_blocks(data, tokenizer, 64, held, seed=0))
    train_blocks, val_blocks, _, _ = reference_blocks(tokenizer, reference_documents(corpus.read_text()), 64)
    assert streamed == sorted(map(tuple, train_blocks)) and val.blocks.tolist() == val_blocks
    refused = train("--data", str(corpus), *SMALL, "--streaming", "--max-tokens", "1000",
                    "--output", str(tmp_path / "no"))
    assert refused.exit_code != 0 and "--max-tokens" in refused.output and "Traceback" not in refused.output


def test_resume_in_the_middle_of_an_epoch_sees_the_same_next_batches(tmp_path, corpus, cache, seen):
    """(6) Trainer's sampler, seeded, skips the batches a checkpoint consumed: the resumed steps get the batches
    the unbroken run got."""
    out = tmp_path / "run"
    common = ["--data", str(corpus), *SMALL[:-4], "--max-steps", "4", "--eval-every", "2", "--data-cache",
              str(cache), "--keep-checkpoints", "--output", str(out)]  # fmt: skip
    assert train(*common).exit_code == 0
    unbroken = list(seen)
    for name in ("checkpoint-4", "final", "metrics.json", "loss_curve.png"):
        target = out / name
        __import__("shutil").rmtree(target) if target.is_dir() else target.unlink()
    seen.clear()
    resumed = train(*common, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(unbroken) == 4 and seen == unbroken[2:]


@pytest.mark.parametrize("where", ["held out", "training"])
def test_the_tokenizer_learns_from_training_documents_only(tmp_path, where):
    """A string frequent in the documents validation and test may hold out (every 20th from the first and from the
    10th) never becomes a token of the tokenizer trained on the fly; the same string in training documents does
    (the control, so that the test can fail)."""
    import random

    rng = random.Random(0)
    filler = lambda: " ".join("".join(rng.choices("abcdefgh", k=rng.randint(2, 7))) for _ in range(200))  # noqa: E731
    marked = {0, 10, 20, 30} if where == "held out" else {1, 11, 21, 31}
    docs = [" ".join(["qzxv"] * 300) if number in marked else filler() for number in range(40)]
    data = tmp_path / "corpus.txt"
    data.write_text("\n\n".join(textwrap.fill(doc, 70) for doc in docs) + "\n", encoding="utf-8")
    result = train("--data", str(data), *SMALL, "--data-cache", str(tmp_path / "cache"), "--output",
                   str(tmp_path / "run"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "no document that validation or test may hold out is read" in result.output
    vocab = AutoTokenizer.from_pretrained(tmp_path / "run" / "final").get_vocab()
    learned = [token for token in vocab if "qz" in token]
    assert bool(learned) == (where == "training"), learned


def test_streaming_files_each_shorter_than_a_block_is_refused(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    for n in range(100):
        (folder / f"note-{n:03d}.txt").write_text(words(15, 11 * n) + "\n")
    result = train_in(tmp_path, folder, "--streaming", "--seq-len", "128", "--eval-blocks", "1")
    assert result.exit_code == 1, result.output
    assert "--streaming packs each of the 100 file(s)" in result.output
    assert "none gives a training block of --seq-len 128 tokens" in result.output
    assert "drop --streaming" in result.output
    assert not (tmp_path / "run" / "final").exists()
    cached = train_in(tmp_path, folder, "--seq-len", "128", "--eval-blocks", "1", name="cached")
    assert cached.exit_code == 0, cached.output  # the cached data packs across files


def test_a_held_out_document_longer_than_the_evaluation_is_cut(tmp_path):
    texts = [words(15_000, 1000 * n) for n in range(3)]  # about 90k characters each
    (tmp_path / "long.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    result = train_in(tmp_path, tmp_path / "long.jsonl", "--eval-blocks", "2")
    assert result.exit_code == 0, result.output
    total = logged(result.output, r"documents, ([\d,]+) tokens \(an end-of-text")
    val, test = (logged(result.output, rf"{name}: 1 documents, ([\d,]+) tokens") for name in ("validation", "test"))
    assert val == test == 2 * 64  # what the evaluation uses, not the documents' tens of thousands
    assert logged(result.output, r"training on ([\d,]+) tokens") == (total - val - test) // 64 * 64
    assert "held-out documents longer than the evaluation" in result.output and "were cut" in result.output


def test_ordinary_text_shards_hold_out_whole_documents(tmp_path):
    """Documents of a few KB, shorter than the evaluation (as the study's are): held out whole, the same ones."""
    folder = tmp_path / "shards"
    folder.mkdir()
    sources = sorted(STDLIB.glob("*.py"))[:60]
    for shard in range(4):
        (folder / f"shard-{shard}.txt").write_text("\n\n".join(p.read_text() for p in sources[shard::4]))
    result = train_in(tmp_path, folder, "--eval-blocks", "128")
    assert result.exit_code == 0, result.output
    assert "were cut" not in result.output
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "final")
    documents = resolve_corpus(str(folder)).all_documents()
    ids = [tokenizer(doc)["input_ids"] + [tokenizer.eos_token_id] for doc in documents]
    lengths = [len(doc) for doc in ids]
    assert max(lengths) < 128 * 64  # every document is shorter than the evaluation
    [entry] = (tmp_path / "cache").glob("blocks-*")
    for split, first in (("val", 0), ("test", 10)):
        whole = [t for index in held_out(lengths, first, 128 * 64) for t in ids[index]]  # the whole-document rule
        blocks = [t for view in ArrowBlocks(entry / f"{split}.arrow", 64).views for t in view.ravel().tolist()]
        assert blocks == whole[: len(whole) // 64 * 64]
