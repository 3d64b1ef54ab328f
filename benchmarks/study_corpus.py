"""The study corpus: enough text that no run of the study sees a training token twice, on any machine, offline.

It is the Python source of two packages every install of hf-geonorm has, at the versions the project pins
(torch 2.13.0 and transformers 5.24): code, and the prose of its docstrings and comments. Files whose content
repeats another's exactly are taken once. The files are put in an order shuffled with a fixed seed and written,
with a blank line between them, into text shards of about 4 MB, so that the documents ``train`` holds out for
validation and test (one in 20 each, from the first) are a mix of both packages rather than the first of them in
alphabetical order. Each shard is longer than the evaluation, so ``train`` holds the shards out by pieces (not
whole files), without the pieces training text holds anyway; ``benchmarks/split_leak.py`` measures what that
leaves, and what a folder of the files would (phases a-h predate that split).

``--layout files`` writes the same files in the same order as a folder of text files, one per source file
(``00000.txt``, ...), into ``corpora/study_files``, recorded in ``results/study_corpus_files.json``: ``train`` then
holds out whole files, without near-duplicates (phase i and after). The shards' record stays as phases a-h used it.

The script then prepares the data as every study run does (``train``'s own data step, at the study's sequence
length and evaluation size), which tokenizes it into the cache the runs read, and writes what it took, its hash and
its size in tokens (training, validation, test) to ``benchmarks/results/study_corpus.json``.

    python benchmarks/study_corpus.py [--layout shards|files] [--out DIR] [--data-cache DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import random
import shutil
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
CORPORA = RESULTS / "sweeps" / "corpora"  # ignored by git
# layout: (folder under CORPORA, record under RESULTS)
LAYOUTS = {"shards": ("study", "study_corpus.json"), "files": ("study_files", "study_corpus_files.json")}
PACKAGES = {"torch": "2.13.0", "transformers": "5.24"}  # the versions the README's install and pyproject pin
SHARD_BYTES = 4_000_000
SEED = 0
# the study's data step: the sequence length and the evaluation blocks of every study run
SEQ_LEN, EVAL_BLOCKS = 128, 1024


def package_files(name: str) -> tuple[str, list[Path]]:
    """The installed version of package ``name`` and its ``.py`` files, sorted by path."""
    version = importlib.metadata.version(name)
    if not version.startswith(PACKAGES[name]):
        raise SystemExit(f"{name} {version} is installed; the study corpus is made of {name} {PACKAGES[name]}")
    root = Path(importlib.util.find_spec(name).origin).parent
    return version, sorted(p for p in root.rglob("*.py") if p.is_file())


def source_texts() -> tuple[dict[str, str], list[str], int]:
    """The packages' versions, the text of each of their files (stripped; each content once, none empty) in the
    corpus's shuffled order, and how many files were skipped."""
    taken, seen, versions, skipped = [], set(), {}, 0
    for name in PACKAGES:
        versions[name], files = package_files(name)
        for path in files:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            digest = hashlib.sha256(text.encode()).hexdigest()
            if not text or digest in seen:
                skipped += 1
                continue
            seen.add(digest)
            taken.append(text)
    random.Random(SEED).shuffle(taken)
    return versions, taken, skipped


def layout_files(taken: list[str], layout: str) -> list[tuple[str, bytes]]:
    """The corpus's text files (name, content) in ``layout``: shards of about ``SHARD_BYTES`` with a blank line
    between source files, or one text file per source file."""
    if layout == "files":
        return [(f"{number:05d}.txt", (text + "\n").encode()) for number, text in enumerate(taken)]
    groups, shard, size = [], [], 0
    for text in taken:
        shard.append(text)
        size += len(text.encode())
        if size >= SHARD_BYTES:
            groups.append(shard)
            shard, size = [], 0
    groups += [shard] if shard else []
    return [(f"shard-{n:03d}.txt", ("\n\n\n".join(group) + "\n").encode()) for n, group in enumerate(groups)]


def build(out: Path, layout: str) -> dict:
    """Write the corpus's text files in ``layout`` into ``out`` (replaced whole); what was taken."""
    versions, taken, skipped = source_texts()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    corpus_hash, written = hashlib.sha256(), layout_files(taken, layout)
    for name, data in written:
        (partial / name).write_bytes(data)
        corpus_hash.update(data)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    between = "a blank line between them" if layout == "shards" else "one text file each"
    return {"packages": versions, "files": len(taken), "duplicate_or_empty_files_skipped": skipped,
            "shards" if layout == "shards" else "text_files": len(written),
            "bytes": sum(len(data) for _, data in written), "sha256": corpus_hash.hexdigest(),
            "order": f"files shuffled with random.Random({SEED}), {between}"}  # fmt: skip


def token_counts(out: Path, cache: str) -> dict:
    """The corpus's tokens as the study's runs see them: ``train``'s data step (the tokenizer trained on the fly,
    the held-out documents, the blocks), which also fills the cache the runs read."""
    from hf_geonorm.training.data.prepare import data_request, data_source, training_data
    from hf_geonorm.training.options import LEGACY_HELD_OUT_RULE, TrainOptions

    options = TrainOptions(data=str(out), data_cache=cache, seq_len=SEQ_LEN, eval_blocks=EVAL_BLOCKS,
                           held_out_rule=LEGACY_HELD_OUT_RULE)  # the study's runs' (sweep_study.BASE)
    request = data_request(options)
    source = data_source(request, print)
    facts = training_data(source, request, print).facts
    return {"seq_len": SEQ_LEN, "eval_blocks": EVAL_BLOCKS, "vocab_size": len(source.tokenizer), **facts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="shards")
    parser.add_argument("--out", type=Path, default=None, help="default: the layout's folder under " + str(CORPORA))
    parser.add_argument("--data-cache", default=str(Path("~/.cache/hf-geonorm/study").expanduser()))
    args = parser.parse_args()
    folder, record_name = LAYOUTS[args.layout]
    out = (args.out or CORPORA / folder).absolute()
    record = {"folder": os.path.relpath(out, Path(__file__).parent.parent), **build(out, args.layout)}
    record["tokens"] = token_counts(out, args.data_cache)
    (RESULTS / record_name).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
