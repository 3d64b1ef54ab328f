"""What ``--data`` names, as a ``Corpus``: an ordered list of shards (files, or a ``datasets`` name) and the
documents each holds, read in pieces so that no file is ever held whole in memory.

A document is what validation and test hold out whole and what the end-of-text token closes. Documents are
pieces of bounded size, so that the held-out ones spread over the data and no file is one huge document:

- a text file (given by name, or in a folder, or of the standard library's source, the default) is cut into
  pieces: a piece ends before the first non-blank line that follows a blank (whitespace-only) line once it holds
  ``DOC_MIN_CHARS`` characters, and at the first line end once it holds ``PIECE_CHARS`` (text without blank lines,
  one sentence a line, is cut at line ends); a line longer than ``PIECE_CHARS`` is cut at whitespace;
- each row of a JSON lines or parquet file (its ``text`` column), or of a ``datasets`` corpus, is one document, cut
  every ``DOC_MAX_CHARS`` characters when it is longer.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..loading import first_line
from ..text_files import BINARY_PROBE, text_chunks
from .cache_checks import content_key
from .data import TEXT_SUFFIXES, looks_like_path, stdlib_files

DOC_MIN_CHARS = 1_000
PIECE_CHARS = 8_000
DOC_MAX_CHARS = 1_000_000
ROW_SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet"}


@dataclass(frozen=True)
class Corpus:
    """The shards of ``--data`` in order, each ``(kind, path or name)`` with kind ``paragraphs`` (a text file cut
    at blank lines), ``file`` (a text file, one document), ``jsonl``, ``parquet`` or ``hub``; a label for the log;
    and a fingerprint of the data (its files' kinds, sizes and content hashes, ``cache_checks.content_key``; a
    ``datasets`` name) that keys the cache and that a resumed run must match."""

    shards: tuple[tuple[str, str], ...]
    label: str
    fingerprint: str


def resolve_corpus(data: str | None) -> Corpus:
    """The corpus ``data`` names: ``None`` (the standard library's source), a text, JSON lines or parquet file, a
    folder of such files (binary ones skipped with a warning), or a ``datasets`` name; a ``ValueError`` that names
    what is wrong otherwise."""
    if data is None:
        files = [p for p in stdlib_files() if p.stat().st_size > 0]
        return _local([("file", p) for p in files], f"the Python standard library's source ({len(files)} files)")
    path = Path(data).expanduser()
    if path.is_file():
        kind = ROW_SUFFIXES.get(path.suffix.lower(), "paragraphs")
        if kind == "paragraphs" and _is_binary(path):
            raise ValueError(f"{path} is a binary file (it holds NUL bytes), not text: give a UTF-8 text file")
        if path.stat().st_size == 0:
            raise ValueError(f"{path} contains no text")
        return _local([(kind, path)], str(path))
    if not path.is_dir():
        return _hub_corpus(data)
    suffixes = (*TEXT_SUFFIXES, *ROW_SUFFIXES)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in suffixes and p.stat().st_size)
    binary = [p for p in files if p.suffix.lower() in TEXT_SUFFIXES and _is_binary(p)]
    if binary:
        more = f" and {len(binary) - 1} more" if len(binary) > 1 else ""
        warnings.warn(f"skipped {binary[0]}{more}: binary or without text (give UTF-8 text files)", stacklevel=2)
    shards = [(ROW_SUFFIXES.get(p.suffix.lower(), "file"), p) for p in files if p not in set(binary)]
    if not shards:
        raise ValueError(
            f"{data} holds no text files ({', '.join((*TEXT_SUFFIXES, *ROW_SUFFIXES))}); give a folder of text files"
        )
    return _local(shards, f"{len(shards)} files under {path}")


def _is_binary(path: Path) -> bool:
    with open(path, "rb") as f:
        return b"\0" in f.read(BINARY_PROBE)


def _local(shards: list[tuple[str, Path]], label: str) -> Corpus:
    return Corpus(tuple((kind, str(p.absolute())) for kind, p in shards), label, content_key(shards))


def _hub_corpus(name: str) -> Corpus:
    if looks_like_path(name):
        raise ValueError(f"{name}: no such file or folder")
    try:
        import datasets

        datasets.load_dataset(name, split="train", streaming=True)
    except Exception as error:  # noqa: BLE001 - offline, unknown name, ...
        raise ValueError(f"{name}: no such file or folder, and no datasets corpus ({first_line(error)})") from None
    digest = hashlib.sha256(json.dumps(["hub", name]).encode()).hexdigest()
    return Corpus((("hub", name),), f"the datasets corpus {name!r}", digest)


def documents(kind: str, source: str) -> Iterator[str]:
    """The documents of one shard, in order (see the module docstring for what a document is)."""
    if kind == "paragraphs":
        found = False
        for doc in paragraph_documents(text_chunks(source)):
            found = True
            yield doc
        if not found:
            raise ValueError(f"{source} contains no text")
    elif kind == "file":
        yield from paragraph_documents(text_chunks(source))
    elif kind == "jsonl":
        yield from _capped_all(_jsonl_texts(Path(source)))
    elif kind == "parquet":
        yield from _capped_all(_parquet_texts(Path(source)))
    else:
        import datasets

        rows = datasets.load_dataset(source, split="train", streaming=True)
        yield from _capped_all(row.get("text") or "" for row in rows)


def corpus_documents(shards: Iterable[tuple[str, str]]) -> Iterator[str]:
    """Every document of ``shards``, in order."""
    for kind, source in shards:
        yield from documents(kind, source)


def paragraph_documents(chunks: Iterable[str]) -> Iterator[str]:
    """Text cut into pieces at blank lines, each of at least ``DOC_MIN_CHARS`` characters (the last one may be
    shorter), and at line ends once a piece holds ``PIECE_CHARS``; the text is kept whole: the pieces joined are the
    input. Pieces of whitespace only are dropped."""
    doc: list[str] = []
    size, after_blank, has_text = 0, False, False
    for line in _lines(chunks):
        blank = not line.strip()
        if doc and ((not blank and after_blank and size >= DOC_MIN_CHARS) or size >= PIECE_CHARS):
            yield "".join(doc)
            doc, size, has_text = [], 0, False
        doc.append(line)
        size += len(line)
        after_blank, has_text = blank, has_text or not blank
    if has_text:
        yield "".join(doc)


def _lines(chunks: Iterable[str]) -> Iterator[str]:
    """The lines of ``chunks`` with their ``\\n``; a line longer than ``PIECE_CHARS`` comes in pieces, cut after
    the last whitespace before ``PIECE_CHARS`` characters (or at ``PIECE_CHARS``, where there is none)."""
    rest = ""
    for chunk in chunks:
        parts = (rest + chunk).split("\n")
        rest = parts.pop()
        for part in parts:
            yield from _cut_long(part + "\n")
        while len(rest) > PIECE_CHARS:
            piece, rest = _split_at_space(rest)
            yield piece
    if rest:
        yield from _cut_long(rest)


def _cut_long(line: str) -> Iterator[str]:
    while len(line) > PIECE_CHARS:
        piece, line = _split_at_space(line)
        yield piece
    if line:
        yield line


def _split_at_space(text: str) -> tuple[str, str]:
    """``text`` cut after its last whitespace within the first ``PIECE_CHARS`` characters."""
    cut = max(text.rfind(" ", 0, PIECE_CHARS), text.rfind("\t", 0, PIECE_CHARS)) + 1
    cut = cut if cut > 0 else PIECE_CHARS
    return text[:cut], text[cut:]


def _capped(text: str) -> Iterator[str]:
    for start in range(0, len(text), DOC_MAX_CHARS):
        yield text[start : start + DOC_MAX_CHARS]


def _capped_all(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        if text and text.strip():
            yield from _capped(text)


def _jsonl_texts(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not JSON ({error.msg}); one JSON object a line") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}, line {number}: no \"text\" string; every line needs one")
            yield row["text"]


def _parquet_texts(path: Path) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except Exception as error:  # noqa: BLE001 - damaged or not parquet: reported in one line
        raise ValueError(f"{path} is not a readable parquet file: {first_line(error)}") from None
    if "text" not in file.schema_arrow.names:
        raise ValueError(f"{path} has no 'text' column (it has {', '.join(file.schema_arrow.names)})")
    for batch in file.iter_batches(columns=["text"], batch_size=1024):
        yield from (text for text in batch.column(0).to_pylist() if text)
