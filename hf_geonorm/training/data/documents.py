"""How the text of ``--data`` becomes documents (``corpus.Corpus.documents``), read in pieces so that no file is
ever held whole in memory.

A document is what validation and test hold out whole and what the end-of-text token closes. Documents are
pieces of bounded size, so that the held-out ones spread over the data and no file is one huge document:

- a text file (given by name, or in a folder, or of the standard library's source, the default) is cut into
  pieces: a piece ends before the first non-blank line that follows a blank (whitespace-only) line once it holds
  ``DOC_MIN_CHARS`` characters, and at the first line end once it holds ``PIECE_CHARS`` (text without blank lines,
  one sentence a line, is cut at line ends); a line longer than ``PIECE_CHARS`` is cut at whitespace. Line ends are
  ``\\n`` (``\\r\\n`` and ``\\r`` are read as one), and a byte-order mark at the start is dropped;
- each row of a JSON lines, CSV or parquet file (its text column, ``--text-column``), or of a ``datasets`` corpus, is
  one document, cut every ``DOC_MAX_CHARS`` characters when it is longer.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..._plumbing.text_files import text_chunks
from ...errors import first_line

DOC_MIN_CHARS = 1_000
PIECE_CHARS = 8_000
DOC_MAX_CHARS = 1_000_000
TEXT_TYPES = ("string", "large_string")


@dataclass(frozen=True)
class HubSource:
    """A ``datasets`` corpus: a Hub name or a local dataset folder, and which part of it to read."""

    name: str
    config: str | None = None
    split: str = "train"
    revision: str | None = None


def shard_documents(kind: str, source: str, column: str, hub: HubSource | None) -> Iterator[str]:
    """The documents of one shard of a corpus (``corpus.Corpus``: ``kind`` and ``source``, the rows' text ``column``,
    the ``datasets`` corpus ``hub`` of a ``saved`` or ``hub`` shard), in order."""
    if kind in ("paragraphs", "file"):
        found = False
        for doc in paragraph_documents(normalised(text_chunks(source))):
            found = True
            yield doc
        if not found and kind == "paragraphs":
            raise ValueError(f"{source} contains no text")
    elif kind == "jsonl":
        yield from _capped_all(_jsonl_texts(Path(source), column))
    elif kind == "csv":
        yield from _capped_all(_csv_texts(Path(source), column))
    elif kind == "parquet":
        yield from _capped_all(_parquet_texts(Path(source), column))
    else:
        yield from _capped_all(_dataset_texts(hub, column, saved=kind == "saved"))


def check_csv(path: Path, column: str) -> None:
    header = next(_csv_rows(path), None)
    if header is None:
        raise ValueError(f"{path} contains no text")
    if column not in header:
        raise ValueError(f"{path} is read as a CSV table and has no {column!r} column (its header: "
                         f"{', '.join(header)}); give the column of the text with --text-column")  # fmt: skip


def check_parquet(path: Path, column: str) -> None:
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except Exception as error:  # noqa: BLE001 - damaged or not parquet: reported in one line
        raise ValueError(f"{path} is not a readable parquet file: {first_line(error)}") from None
    schema = file.schema_arrow
    if column not in schema.names:
        raise ValueError(f"{path} has no {column!r} column (it has {', '.join(schema.names)}); give --text-column")
    kind = str(schema.field(column).type)
    if kind not in TEXT_TYPES:
        raise ValueError(f"{path}: column {column!r} holds {kind}, not text (string); give the column of the text "
                         "with --text-column")  # fmt: skip
    if file.metadata.num_rows == 0:
        raise ValueError(f"{path} has no rows")


def parquet_nulls(path: Path, column: str) -> tuple[int, int]:
    """How many rows of a parquet file have a null ``column`` (no text: they are skipped), from each row group's
    statistics where they record it, else by reading that row group's column; and how many rows it has."""
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    meta = file.metadata
    leaf = next((j for j in range(meta.num_columns) if meta.schema.column(j).path == column), None)
    nulls = 0
    for group in range(meta.num_row_groups):
        stats = None if leaf is None else meta.row_group(group).column(leaf).statistics
        if stats is not None and stats.has_null_count:
            nulls += stats.null_count
        else:
            nulls += file.read_row_group(group, columns=[column]).column(0).null_count
    return nulls, meta.num_rows


def open_dataset(source: HubSource, saved: bool, streaming: bool = True) -> object:
    import datasets

    if saved:
        loaded = datasets.load_from_disk(source.name)
        return loaded[source.split] if isinstance(loaded, datasets.DatasetDict) else loaded
    return datasets.load_dataset(source.name, source.config, split=source.split, revision=source.revision,
                                 streaming=streaming)  # fmt: skip


def _dataset_texts(source: HubSource, column: str, saved: bool) -> Iterator[str]:
    for number, row in enumerate(open_dataset(source, saved)):
        text = row.get(column)
        if not isinstance(text, str):
            what = "has no" if text is None else f"has a {type(text).__name__} in its"
            raise ValueError(f"{source.name}, row {number}: {what} {column!r} column; every row needs a string "
                             "there (give --text-column)")  # fmt: skip
        yield text


def normalised(chunks: Iterable[str]) -> Iterator[str]:
    """Text with ``\\r\\n`` and lone ``\\r`` line ends read as ``\\n``, and without a leading byte-order mark."""
    first, carry = True, ""
    for chunk in chunks:
        text = carry + chunk
        if first:
            text, first = text.removeprefix("\ufeff"), False
        carry = "\r" if text.endswith("\r") else ""  # its \n may start the next chunk
        text = text[:-1] if carry else text
        yield text.replace("\r\n", "\n").replace("\r", "\n")
    if carry:
        yield "\n"


def paragraph_documents(chunks: Iterable[str]) -> Iterator[str]:
    """Text cut into pieces at blank lines, each of at least ``DOC_MIN_CHARS`` characters (the last one may be
    shorter), and at line ends once a piece holds ``PIECE_CHARS``; the pieces joined are the input, less the pieces
    of whitespace only (a long run of blank lines), which are dropped."""
    doc: list[str] = []
    size, after_blank, has_text = 0, False, False
    for line in _lines(chunks):
        blank = not line.strip()
        if doc and ((not blank and after_blank and size >= DOC_MIN_CHARS) or size >= PIECE_CHARS):
            if has_text:
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
            if len(part) < PIECE_CHARS:  # the common case, without a generator per line
                yield part + "\n"
            else:
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


def text_lines(path: Path) -> Iterator[str]:
    """The lines of a text file with their line ends, read as a text file is (``text_chunks``: not held whole, a
    binary or compressed file refused, bytes that are not UTF-8 replaced with a warning; ``normalised``)."""
    rest = ""
    for chunk in normalised(text_chunks(path)):
        lines = (rest + chunk).split("\n")
        rest = lines.pop()
        yield from (line + "\n" for line in lines)
    if rest:
        yield rest


def _jsonl_texts(path: Path, column: str) -> Iterator[str]:
    for number, line in enumerate(text_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not JSON ({error.msg}); one JSON object a line") from None
        if not isinstance(row, dict) or not isinstance(row.get(column), str):
            raise ValueError(f"{path}, line {number}: no {column!r} string; every line needs one (or give "
                             "--text-column)")  # fmt: skip
        yield row[column]


CSV_FIELD_LIMIT = 2**31 - 1  # the csv module refuses fields over 128 KB by default; a document may be longer


def _csv_rows(path: Path) -> Iterator[list[str]]:
    """The rows of a CSV file (the header first), read as its text is (``text_lines``)."""
    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
    rows = csv.reader(text_lines(path))
    try:
        yield from rows
    except csv.Error as error:
        raise ValueError(f"{path}, line {rows.line_num}: not CSV ({error})") from None


def _csv_texts(path: Path, column: str) -> Iterator[str]:
    rows = _csv_rows(path)
    header = next(rows)
    where = header.index(column)
    for number, row in enumerate(rows, 2):
        if not row:  # a blank line
            continue
        if len(row) != len(header):
            raise ValueError(f"{path}, row {number}: {len(row)} field(s) where the header has {len(header)}; every "
                             "row needs one for each column")  # fmt: skip
        yield row[where]


def _parquet_texts(path: Path, column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    check_parquet(path, column)
    for batch in pq.ParquetFile(path).iter_batches(columns=[column], batch_size=1024):
        yield from (text for text in batch.column(0).to_pylist() if text)
