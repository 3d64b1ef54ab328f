"""The corpora of the evidence benchmarks, none needing a download: the Python standard library's source
(``stdlib``), English prose (``prose``: Debian's ``fortunes`` package, installed with apt-get when missing, or any
file/folder given with ``--prose``) and a dictionary (``dict``: Debian's ``dict-gcide``), each tokenized with a
byte-level BPE trained on it (``hf_geonorm.training.tokenizer``, as ``hf-geonorm train`` does) and cached on disk."""

from __future__ import annotations

import gzip
import hashlib
import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from hf_geonorm.training.data import read_texts, split_blocks, token_blocks
from hf_geonorm.training.tokenizer import train_tokenizer

CACHE = Path(os.environ.get("HF_GEONORM_BENCH_CACHE", Path.home() / ".cache" / "hf-geonorm-bench"))
FORTUNES = Path("/usr/share/games/fortunes")
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")


def fortunes_texts() -> list[str]:
    """Debian's ``fortunes`` corpus (English prose, quotes, jokes), one document per fortune; apt-get installs
    the package when it is missing."""
    if not FORTUNES.is_dir():
        print("installing Debian's fortunes package (English prose corpus) with apt-get", flush=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "fortunes"], check=False, capture_output=True)
    if not FORTUNES.is_dir():
        raise SystemExit(
            f"no prose corpus: {FORTUNES} is missing and `apt-get install fortunes` failed; pass --prose PATH"
        )
    docs: list[str] = []
    for path in sorted(FORTUNES.iterdir()):
        if path.is_file() and not path.suffix and path.name != "ascii-art":  # art is not prose
            text = path.read_text(encoding="utf-8", errors="replace")
            docs.extend(d.strip() for d in text.split("\n%\n") if d.strip())
    random.Random(0).shuffle(docs)  # the validation tail mixes all the collections
    return docs


def dictionary_texts() -> list[str]:
    """The GNU Collaborative International Dictionary of English (Debian's ``dict-gcide``, installed with apt-get
    when missing): definitions with etymologies and quotations, a third kind of text beside code and prose.
    One document per run of entries of about 2,000 characters, shuffled (the file is alphabetical)."""
    if not GCIDE.is_file():
        print("installing Debian's dict-gcide package (dictionary corpus) with apt-get", flush=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "dict-gcide"], check=False, capture_output=True)
    if not GCIDE.is_file():
        raise SystemExit(f"no dictionary corpus: {GCIDE} is missing and `apt-get install dict-gcide` failed")
    with gzip.open(GCIDE, "rt", encoding="utf-8", errors="replace") as f:
        paragraphs = f.read().split("\n\n")
    docs, current = [], ""
    for paragraph in paragraphs[1:]:  # the first paragraph is the file's header
        current += paragraph + "\n\n"
        if len(current) >= 2000:
            docs.append(current.strip())
            current = ""
    random.Random(0).shuffle(docs)
    return docs


def _take(docs: list[str], max_chars: int) -> tuple[list[str], int]:
    out, total = [], 0
    for doc in docs:
        out.append(doc[: max_chars - total])
        total += len(out[-1])
        if total >= max_chars:
            break
    return out, total


def corpus_texts(name: str, max_chars: int, prose: str | None = None) -> tuple[list[str], str]:
    """The documents of corpus ``name`` (their first ``max_chars`` characters) and a label."""
    if name == "stdlib":
        return read_texts(None, max_chars)
    if name == "prose":
        if prose is not None:
            return read_texts(prose, max_chars)
        out, total = _take(fortunes_texts(), max_chars)
        return out, f"Debian fortunes ({len(out)} fortunes, {total} characters)"
    if name == "dict":
        if prose is not None:  # the tests' stand-in: no apt-get
            return read_texts(prose, max_chars)
        out, total = _take(dictionary_texts(), max_chars)
        return out, f"GNU dictionary GCIDE ({len(out)} documents, {total} characters)"
    raise ValueError(f"unknown corpus {name!r}")


@dataclass
class Corpus:
    """A corpus's train and validation token blocks, and the size of its tokenizer."""

    name: str
    label: str
    train: torch.Tensor
    val: torch.Tensor
    vocab: int


def load_corpus(name: str, vocab_size: int, seq_len: int, max_chars: int, prose: str | None = None) -> Corpus:
    """Token blocks of a corpus, train and validation split; tokenizer and blocks cached on disk."""
    tag = f"{name}_{vocab_size}_{seq_len}_{max_chars}"
    if prose is not None and name in ("prose", "dict"):
        tag += "_" + hashlib.sha1(os.path.abspath(prose).encode()).hexdigest()[:10]
    cached = CACHE / f"{tag}.pt"
    if cached.exists():
        data = torch.load(cached)
        return Corpus(name, data["label"], data["train"], data["val"], data["vocab"])
    texts, label = corpus_texts(name, max_chars, prose)
    tokenizer = train_tokenizer(texts, vocab_size)
    train, val = split_blocks(token_blocks(tokenizer, texts, seq_len))
    CACHE.mkdir(parents=True, exist_ok=True)
    torch.save({"label": label, "train": train, "val": val, "vocab": len(tokenizer)}, cached)
    return Corpus(name, label, train, val, len(tokenizer))

