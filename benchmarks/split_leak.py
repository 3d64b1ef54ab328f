"""How much of `hf-geonorm train`'s held-out text training holds anyway: the leak of its validation and test split.

Measured on the study corpus (``benchmarks/study_corpus.py``: the Python source of torch and transformers, its files
in the study's shuffled order), laid out two ways: as the study writes it (``shards``: text files of about 4 MB, the
source files joined with blank lines) and as a folder of its files (``files``: one text file each, named in that
order). Three splits, each of ``--eval-blocks`` 1024 blocks of ``--seq-len`` 128 tokens a split, as the study's runs:

- ``old``: the rule before whole files, reimplemented here (``old_split``): documents (pieces of 1-8 KB cut at blank
  lines) numbered across the corpus, 0, 20, 40, ... validation and 10, 30, 50, ... test, each until it holds the
  evaluation's tokens; on the shards, as the study ran;
- ``new (shards)``: ``train``'s split (``split.held_out_plan``) on the shards: each shard is longer than the
  evaluation, so it holds out documents, without near-duplicates of training text;
- ``new (files)``: ``train``'s split on the folder of files: whole files, without near-duplicates.

Covered, exactly and independently of the MinHash the split uses: a character of a held-out piece is covered when
it lies in a window of ``WINDOW`` (100) consecutive characters of the piece that occurs verbatim in a training piece
(of any file, its own included; a window across two training pieces is not looked for). A piece's coverage is its
covered characters over its characters, found with Python string sets (no hash or sample of this script's own); a
piece shorter than the window counts as uncovered (the report gives their share). The leak: the share of a split's
characters in pieces at least ``LEAKED`` (80%) covered. A window of 100 characters is about two lines of code:
text copied from training, not the one-line idioms every file of a library shares (``super().__init__()``, an
import); ``SHORT_WINDOW`` (50 characters, about one line) is reported too, where those idioms count as covered.

Tokens are counted with one tokenizer for every split: the byte-level BPE of 2,048 tokens ``train`` trains on the
fly on the folder of files (the old rule's runs used one trained on the shards; a piece at the edge of a split may
differ). ``--files N`` measures the first N files only (a deterministic subset, in the corpus's order).

Writes ``split_leak.json`` and ``.md`` to ``--out`` (default benchmarks/results); every number in them is computed by
this script. About 10 minutes for the whole corpus on a busy 2-core machine (most of it the exact coverage).

    python benchmarks/split_leak.py [--files N] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from study_corpus import SEQ_LEN, SHARD_BYTES, source_texts

from hf_geonorm.training.data.corpus import TEST, VAL, VAL_EVERY, Corpus, candidate_split, resolve_corpus
from hf_geonorm.training.data.split import DROPPED, held_out_plan
from hf_geonorm.training.data.token_batches import encode_documents, end_of_text

RESULTS = Path(__file__).parent / "results"
WORK = RESULTS / "sweeps" / "corpora" / "split_leak"  # ignored by git
EVAL_BLOCKS, VOCAB = 1024, 2048  # the study's evaluation and vocabulary
WINDOW, SHORT_WINDOW, LEAKED = 100, 50, 0.8
SPLITS = {VAL: "validation", TEST: "test"}


def write_layouts(texts: list[str], work: Path) -> dict[str, Path]:
    """The corpus as the study's shards and as a folder of its files, written under ``work`` (replaced)."""
    shards, files = work / "shards", work / "files"
    for folder in (shards, files):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    shard, size, count = [], 0, 0
    for number, text in enumerate(texts):
        (files / f"{number:05d}.txt").write_text(text + "\n", encoding="utf-8")
        shard.append(text)
        size += len(text.encode())
        if size >= SHARD_BYTES or number == len(texts) - 1:
            (shards / f"shard-{count:03d}.txt").write_text("\n\n\n".join(shard) + "\n", encoding="utf-8")
            shard, size, count = [], 0, count + 1
    return {"shards": shards, "files": files}


def study_tokenizer(files: Path, work: Path) -> Any:
    """The tokenizer ``train`` trains on the fly on the folder of files (cached under ``work``)."""
    from hf_geonorm.training.data.prepare import data_request, data_source
    from hf_geonorm.training.options import TrainOptions

    options = TrainOptions(data=str(files), data_cache=str(work / "cache"), seq_len=SEQ_LEN, eval_blocks=EVAL_BLOCKS,
                           vocab_size=VOCAB)  # fmt: skip
    return data_source(data_request(options), print).tokenizer


def numbered(corpus: Corpus) -> Iterator[tuple[int, str]]:
    yield from enumerate(corpus.all_documents())


def old_split(corpus: Corpus, tokenizer: Any) -> dict[int, int]:
    """The rule before whole files: documents 0, 20, ... validation, 10, 30, ... test (the middle one of fewer than
    20), each while the ones before hold fewer than the evaluation's tokens (a test document is never a validation
    one); each document's number and split."""
    budget, eos = EVAL_BLOCKS * SEQ_LEN, end_of_text(tokenizer)
    held, size = {}, {VAL: 0, TEST: 0}
    for number, text in numbered(corpus):
        split = candidate_split(number, VAL_EVERY)
        if split and size[split] < budget:
            held[number] = split
            size[split] += int(encode_documents([text], tokenizer, eos)[1][0])
        if min(size.values()) >= budget:
            break
    return held


def coverage(corpus: Corpus, held: dict[int, int], window: int) -> dict[int, float]:
    """Each held-out piece's coverage by the training pieces (those ``held`` does not name) at ``window``
    characters, as the module says."""
    pieces = dict(item for item in numbered(corpus) if item[0] in held)
    windows = {w for text in pieces.values() for w in (text[i : i + window] for i in range(len(text) - window + 1))}
    found: set[str] = set()
    for number, text in numbered(corpus):
        if number not in held:
            found |= windows.intersection(text[i : i + window] for i in range(len(text) - window + 1))
    result = {}
    for number, text in pieces.items():
        covered = bytearray(len(text))
        for i in range(len(text) - window + 1):
            if text[i : i + window] in found:
                covered[i : i + window] = b"\x01" * window
        result[number] = sum(covered) / len(text) if len(text) >= window else 0.0
    return result


def measure(
    name: str, corpus: Corpus, held: dict[int, int], dropped: set[int], extra: dict[str, Any]
) -> dict[str, Any]:
    """The leak of one split (``held``: each held-out piece's number and split; ``dropped``: the pieces that neither
    train nor are held out)."""
    start = time.perf_counter()
    lengths = {number: len(text) for number, text in numbered(corpus) if number in held}
    row = {"split": name, **extra}
    for window, label in ((WINDOW, ""), (SHORT_WINDOW, f"_{SHORT_WINDOW}")):
        covered = coverage(corpus, held | dict.fromkeys(dropped, DROPPED), window)
        for code, split in SPLITS.items():
            mine = [n for n, c in held.items() if c == code]
            chars = sum(lengths[n] for n in mine)
            leaked = [n for n in mine if covered[n] >= LEAKED]
            row.setdefault(split, {"pieces": len(mine), "characters": chars})
            row[split] |= {
                f"pieces_leaked{label}": len(leaked), f"leak{label}": sum(lengths[n] for n in leaked) / chars,
                f"mean_coverage{label}": sum(covered[n] * lengths[n] for n in mine) / chars,
                f"short_pieces_share{label}": sum(lengths[n] for n in mine if lengths[n] < window) / chars,
            }  # fmt: skip
    row["coverage_seconds"] = time.perf_counter() - start
    print(json.dumps(row))
    return row


def new_split(corpus: Corpus, tokenizer: Any) -> tuple[dict[int, int], set[int], dict[str, Any]]:
    """``train``'s split: each held-out piece's number and split, the pieces it drops, and what the plan says."""
    start = time.perf_counter()
    plan = held_out_plan(corpus, tokenizer, SEQ_LEN, EVAL_BLOCKS)
    seconds = time.perf_counter() - start
    held = {n: code for n, (code, _) in plan.held.items() if code != DROPPED}
    dropped = {n for n, (code, _) in plan.held.items() if code == DROPPED}
    extra = {"held_out_by": "files" if plan.files else "documents", "split_seconds": seconds,
             "files_held_out": {SPLITS[c]: plan.held_files[c] for c in SPLITS},
             "pieces_removed": {SPLITS[c]: plan.removed[c] for c in SPLITS},
             "pieces_dropped": len(dropped)}  # fmt: skip
    if plan.files:
        trained_files = {plan.key(n)[0] for n in range(plan.documents) if n not in plan.held}
        extra["held_out_files_with_a_trained_piece"] = len({plan.key(n)[0] for n in held} & trained_files)
    return held, dropped, extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=None, help="the first N files of the corpus only")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    versions, texts, _ = source_texts()
    texts = texts[: args.files]
    layouts = write_layouts(texts, args.work)
    tokenizer = study_tokenizer(layouts["files"], args.work)
    shards, files = (resolve_corpus(str(layouts[name])) for name in ("shards", "files"))
    rows = [measure("old (shards)", shards, old_split(shards, tokenizer), set(), {"held_out_by": "documents"})]
    for name, corpus in (("new (shards)", shards), ("new (files)", files)):
        rows.append(measure(name, corpus, *new_split(corpus, tokenizer)))
    record = {"corpus": {"packages": versions, "files": len(texts), "subset": args.files is not None,
                         "characters": sum(map(len, texts))},
              "seq_len": SEQ_LEN, "eval_blocks": EVAL_BLOCKS, "vocab_size": VOCAB, "window": WINDOW,
              "short_window": SHORT_WINDOW, "leaked_at": LEAKED, "rows": rows}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "split_leak.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (args.out / "split_leak.md").write_text(report(record), encoding="utf-8")


def report(record: dict[str, Any]) -> str:
    """The Markdown page of a record."""
    corpus, short = record["corpus"], record["short_window"]
    what = f"the first {corpus['files']:,} files" if corpus["subset"] else f"all {corpus['files']:,} files"
    lines = [
        "# The held-out split's leak", "",
        f"Written by `python benchmarks/split_leak.py` on the study corpus ({what}, {corpus['characters'] / 1e6:.0f}M "
        f"characters; {', '.join(f'{k} {v}' for k, v in corpus['packages'].items())}), --seq-len {record['seq_len']}, "
        f"--eval-blocks {record['eval_blocks']}. A held-out piece's coverage: the share of its characters inside a "
        f"window of {record['window']} characters of it found verbatim in a training piece ({short} in the columns "
        f"so marked); leak: the share of a split's characters in pieces at least {record['leaked_at']:.0%} covered "
        "(the script's docstring has the details).", "",
        "| split | held out by | test pieces | test leak | test pieces leaked | test mean coverage | validation leak "
        f"| test leak, {short} | validation leak, {short} | files held out (val / test) | pieces removed as "
        "duplicates (val / test) | held-out files with a trained piece |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in record["rows"]:
        test, val = row["test"], row["validation"]
        files, removed = row.get("files_held_out"), row.get("pieces_removed")
        files_cell = f"{files['validation']} / {files['test']}" if row["held_out_by"] == "files" else "-"
        removed_cell = f"{removed['validation']} / {removed['test']}" if removed else "-"
        lines.append(
            f"| {row['split']} | {row['held_out_by']} | {test['pieces']:,} | {test['leak']:.1%} | "
            f"{test['pieces_leaked']} | {test['mean_coverage']:.1%} | {val['leak']:.1%} | {test[f'leak_{short}']:.1%} "
            f"| {val[f'leak_{short}']:.1%} | {files_cell} | {removed_cell} | "
            f"{row.get('held_out_files_with_a_trained_piece', '-')} |"
        )
    old, new = record["rows"][0]["test"], record["rows"][-1]["test"]
    lines += ["", f"Whole files without near-duplicates leave {new['leak']:.2%} of the test characters leaked, against "
              f"{old['leak']:.1%} before; at {short}-character windows {new[f'leak_{short}']:.2%} against "
              f"{old[f'leak_{short}']:.1%}."]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
