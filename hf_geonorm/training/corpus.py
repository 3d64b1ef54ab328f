"""What ``--data`` names, as a ``Corpus`` (the first step of the data: documents, tokenizer, blocks): an ordered
list of shards (files, or a ``datasets`` corpus) and the documents each holds, read in pieces so that no file is ever
held whole in memory.

A document is what validation and test hold out whole and what the end-of-text token closes. Documents are
pieces of bounded size, so that the held-out ones spread over the data and no file is one huge document:

- a text file (given by name, or in a folder, or of the standard library's source, the default) is cut into
  pieces: a piece ends before the first non-blank line that follows a blank (whitespace-only) line once it holds
  ``DOC_MIN_CHARS`` characters, and at the first line end once it holds ``PIECE_CHARS`` (text without blank lines,
  one sentence a line, is cut at line ends); a line longer than ``PIECE_CHARS`` is cut at whitespace. Line ends are
  ``\\n`` (``\\r\\n`` and ``\\r`` are read as one), and a byte-order mark at the start is dropped;
- each row of a JSON lines or parquet file (its text column, ``--text-column``), or of a ``datasets`` corpus, is one
  document, cut every ``DOC_MAX_CHARS`` characters when it is longer.

What a file is, is read from its content where the name can mislead: a ``.json`` file of one object a line is
JSON lines; a JSON array is refused by name. Hidden files and folders (a name starting with ``.``) are skipped,
and so are binary files in a folder, each with a warning that counts them; FIFOs and device files are refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sysconfig
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import first_line
from ..files.checksums import file_sha256
from ..files.text_files import BINARY_PROBE, text_chunks

DOC_MIN_CHARS = 1_000
PIECE_CHARS = 8_000
DOC_MAX_CHARS = 1_000_000
ROW_SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet"}
SAVED_DATASET = ("dataset_info.json", "state.json")  # what Dataset.save_to_disk writes
TEXT_TYPES = ("string", "large_string")
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".csv", ".html", ".xml", ".c", ".h", ".js")
# Of the data caches (the tokenizer trained on the fly, the packed blocks): a new way of cutting documents or
# packing blocks gets new cache keys.
FORMAT = 6  # 5: meta.json records the Arrow files' checksums; 6: no document of whitespace only


def looks_like_path(spec: str) -> bool:
    """Whether ``spec`` names a local file or folder rather than a Hub name (``NAME`` or ``ORG/NAME``)."""
    return (
        spec.startswith((".", "/", "~"))
        or spec.count("/") > 1
        or (os.sep != "/" and os.sep in spec)
        or spec.lower().endswith(TEXT_SUFFIXES)
    )


def stdlib_files() -> list[Path]:
    """The Python standard library's own top-level source files, sorted: text every Python install has."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


@dataclass(frozen=True)
class HubSource:
    """A ``datasets`` corpus: a Hub name or a local dataset folder, and which part of it to read."""

    name: str
    config: str | None = None
    split: str = "train"
    revision: str | None = None


@dataclass(frozen=True)
class Corpus:
    """The shards of ``--data`` in order, each ``(kind, path or name)`` with kind ``paragraphs`` (a text file given
    by name), ``file`` (a text file of a folder), ``jsonl``, ``parquet``, ``saved`` (a ``save_to_disk`` folder) or
    ``hub``; the rows' text column; a label for the log; and a fingerprint of the data that keys the cache and that a
    resumed run must match (its files' kinds, sizes and content hashes, ``cache_checks.content_key``; a ``datasets``
    corpus's name, config, split, revision and fingerprint)."""

    shards: tuple[tuple[str, str], ...]
    label: str
    fingerprint: str
    column: str = "text"
    hub: HubSource | None = None

    def documents(self, shard: int) -> Iterator[str]:
        """The documents of one shard, in order (see the module docstring for what a document is)."""
        kind, source = self.shards[shard]
        if kind in ("paragraphs", "file"):
            found = False
            for doc in paragraph_documents(normalised(text_chunks(source))):
                found = True
                yield doc
            if not found and kind == "paragraphs":
                raise ValueError(f"{source} contains no text")
        elif kind == "jsonl":
            yield from _capped_all(_jsonl_texts(Path(source), self.column))
        elif kind == "parquet":
            yield from _capped_all(_parquet_texts(Path(source), self.column))
        else:
            yield from _capped_all(_dataset_texts(self.hub, self.column, saved=kind == "saved"))

    def all_documents(self) -> Iterator[str]:
        """Every document of every shard, in order."""
        for shard in range(len(self.shards)):
            yield from self.documents(shard)

    def tokenizer_sample(self, chars: int) -> tuple[list[str], bool]:
        """The first training documents up to ``chars`` characters, and whether that is all of them. Every document
        that validation or test may hold out (``may_be_held_out``) is left out, so that a tokenizer trained on the
        sample learns nothing of the text the runs are judged on (a string frequent there only never becomes a
        token). Which document is the test one in a corpus of fewer than ``VAL_EVERY`` depends on their count, so
        the documents are counted up to ``VAL_EVERY`` even past the sample."""
        taken: list[tuple[int, str]] = []
        total, count, complete = 0, 0, True
        for number, doc in enumerate(self.all_documents()):
            count = number + 1
            if total >= chars:
                complete = False
                if count > VAL_EVERY:
                    break
                continue
            if number % VAL_EVERY not in (0, VAL_EVERY // 2):
                taken.append((number, doc))
                total += len(doc)
        return [doc for number, doc in taken if not may_be_held_out(number, count)], complete


def resolve_corpus(data: str | None, column: str = "text", hub: HubSource | None = None) -> Corpus:
    """The corpus ``data`` names: ``None`` (the standard library's source), a text, JSON lines or parquet file, a
    folder of such files, a folder written by ``Dataset.save_to_disk``, or a ``datasets`` name (``hub`` says which
    config, split and revision; with a config, a local folder is read as a ``datasets`` dataset too); a
    ``ValueError`` that names what is wrong otherwise. ``column`` is the rows' text column."""
    if data is None:
        files = [p for p in stdlib_files() if p.stat().st_size > 0]
        return _local([("file", p) for p in files], f"the Python standard library's source ({len(files)} files)")
    path = Path(data).expanduser()
    source = HubSource(data) if hub is None else HubSource(data, hub.config, hub.split, hub.revision)
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise ValueError(f"{path} is {_special_kind(path)}, not a file or folder: give a text file or a folder")
    if path.is_file():
        kind = _file_kind(path, column)
        if path.stat().st_size == 0:
            raise ValueError(f"{path} contains no text")
        if kind == "paragraphs" and _is_binary(path):
            raise ValueError(f"{path} is a binary file (it holds NUL bytes), not text: give a UTF-8 text file")
        return _local([(kind, path)], str(path), column)
    if path.is_dir() and (all((path / name).is_file() for name in SAVED_DATASET) or source.config is not None):
        return _dataset_corpus(source, column, saved=source.config is None)
    if not path.is_dir():
        if looks_like_path(data):
            raise ValueError(f"{data}: no such file or folder")
        return _dataset_corpus(source, column, saved=False)
    return _folder_corpus(path, column)


def _folder_corpus(path: Path, column: str) -> Corpus:
    suffixes = (*TEXT_SUFFIXES, *ROW_SUFFIXES)
    found = sorted(p for p in path.rglob("*") if p.suffix.lower() in suffixes)
    hidden = [p for p in found if any(part.startswith(".") for part in p.relative_to(path).parts)]
    if hidden:
        warnings.warn(f"skipped {len(hidden)} hidden file(s) under {path} (names or folders starting with '.'), "
                      f"e.g. {hidden[0]}", stacklevel=3)  # fmt: skip
    files = [p for p in found if p not in set(hidden) and p.is_file() and p.stat().st_size]
    binary = [p for p in files if _file_kind(p, column) == "paragraphs" and _is_binary(p)]
    if binary:
        more = f" and {len(binary) - 1} more" if len(binary) > 1 else ""
        warnings.warn(f"skipped {binary[0]}{more}: binary or without text (give UTF-8 text files)", stacklevel=3)
    shards = [(_file_kind(p, column).replace("paragraphs", "file"), p) for p in files if p not in set(binary)]
    if not shards:
        raise ValueError(
            f"{path} holds no text files ({', '.join((*TEXT_SUFFIXES, *ROW_SUFFIXES))}); give a folder of text files"
        )
    return _local(shards, f"{len(shards)} files under {path}", column)


def _special_kind(path: Path) -> str:
    mode = path.stat().st_mode
    for check, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if check(mode):
            return name
    return "not a regular file"


def _file_kind(path: Path, column: str) -> str:
    """What a file holds: ``jsonl``, ``parquet`` (its text column checked) or text (``paragraphs``). A ``.json``
    file is JSON lines when its first line is one JSON object; a JSON array or an object over many lines is
    refused."""
    kind = ROW_SUFFIXES.get(path.suffix.lower(), "paragraphs")
    if kind == "parquet":
        _check_parquet(path, column)
    if path.suffix.lower() != ".json":
        return kind
    with open(path, "rb") as f:
        first = f.readline(1 << 20).decode("utf-8", "replace").strip()
    if first.startswith("["):
        raise ValueError(f"{path} is a JSON array: give JSON lines (one object a line, each with a {column!r} string)")
    try:
        return "jsonl" if isinstance(json.loads(first), dict) else "paragraphs"
    except json.JSONDecodeError:
        if first.startswith("{"):
            raise ValueError(f"{path} is one JSON object over many lines: give JSON lines (one object a line, each "
                             f"with a {column!r} string)") from None  # fmt: skip
        return "paragraphs"


def _check_parquet(path: Path, column: str) -> None:
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


def _is_binary(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return b"\0" in f.read(BINARY_PROBE)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}; make it readable (chmod u+r) or move it "
                         "out of the data") from None  # fmt: skip


def content_key(shards: Iterable[tuple[str, Path]]) -> str:
    """The key of local shards: in order, each one's kind, size and content hash (not its path or mtime)."""
    parts = [(kind, path.stat().st_size, file_sha256(path)) for kind, path in shards]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _local(shards: list[tuple[str, Path]], label: str, column: str = "text") -> Corpus:
    digest = hashlib.sha256(json.dumps([content_key(shards), column]).encode()).hexdigest()
    return Corpus(tuple((kind, str(p.absolute())) for kind, p in shards), label, digest, column)


def _open_dataset(source: HubSource, saved: bool, streaming: bool = True) -> object:
    import datasets

    if saved:
        loaded = datasets.load_from_disk(source.name)
        return loaded[source.split] if isinstance(loaded, datasets.DatasetDict) else loaded
    return datasets.load_dataset(source.name, source.config, split=source.split, revision=source.revision,
                                 streaming=streaming)  # fmt: skip


def _dataset_corpus(source: HubSource, column: str, saved: bool) -> Corpus:
    """A ``datasets`` corpus, checked before any work: it opens, and its rows have the text column as strings."""
    try:
        rows = _open_dataset(source, saved)
        features = rows.features
    except Exception as error:  # noqa: BLE001 - offline, unknown name, config or split, ...
        what = "saved dataset" if saved else "datasets corpus"
        raise ValueError(f"{source.name}: no such file or folder, and no {what} ({first_line(error)})") from None
    if features is not None:
        if column not in features:
            raise ValueError(f"{source.name} has no {column!r} column (it has {', '.join(features)}); give "
                             "--text-column")  # fmt: skip
        kind = getattr(features[column], "dtype", type(features[column]).__name__)
        if kind not in TEXT_TYPES:
            raise ValueError(f"{source.name}: column {column!r} holds {kind}, not text (string); give the column "
                             "of the text with --text-column")  # fmt: skip
    identity = _saved_fingerprint(source) if saved else _builder_hash(source)
    parts = ["saved" if saved else "hub", source.name, source.config, source.split, source.revision, identity, column]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
    part = "".join(f", {name} {value}" for name, value in (("config", source.config), ("split", source.split),
                                                           ("revision", source.revision)) if value)  # fmt: skip
    kind = "saved" if saved else "hub"
    return Corpus(((kind, source.name),), f"the datasets corpus {source.name!r}{part}", digest, column, source)


def _saved_fingerprint(source: HubSource) -> str | None:
    """What identifies a ``save_to_disk`` folder's data: the fingerprint its ``state.json`` records (of the split
    read, when it holds several)."""
    folder = Path(source.name)
    state = folder / "state.json" if (folder / "state.json").is_file() else folder / source.split / "state.json"
    try:
        return json.loads(state.read_text(encoding="utf-8")).get("_fingerprint")
    except (OSError, ValueError):
        return None


def _builder_hash(source: HubSource) -> str | None:
    """What identifies a corpus's data beyond its name: the builder's hash (its data files' versions)."""
    try:
        import datasets

        return datasets.load_dataset_builder(source.name, source.config, revision=source.revision).hash
    except Exception:  # noqa: BLE001 - the corpus opened; without a hash the name and revision key it
        return None


def _dataset_texts(source: HubSource, column: str, saved: bool) -> Iterator[str]:
    for number, row in enumerate(_open_dataset(source, saved)):
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


def _jsonl_texts(path: Path, column: str) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
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


def _parquet_texts(path: Path, column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    _check_parquet(path, column)
    for batch in pq.ParquetFile(path).iter_batches(columns=[column], batch_size=1024):
        yield from (text for text in batch.column(0).to_pylist() if text)


# One document in VAL_EVERY (in corpus order) is held out for validation and as many for test (pipeline.py).
VAL_EVERY = 20


def test_offset(documents: int) -> int:
    """The first test document: the 10th, or the middle one of a corpus of fewer than ``VAL_EVERY`` documents."""
    return min(VAL_EVERY // 2, documents // 2)


def may_be_held_out(number: int, documents: int) -> bool:
    """Whether document ``number`` of a corpus of ``documents`` may be a validation or test one, whatever the
    tokenizer (how many of the candidates are taken depends on their token counts): every ``VAL_EVERY``-th from the
    first and from the ``VAL_EVERY // 2``-th, and the test offset of a small corpus. ``documents`` need only be
    known up to ``VAL_EVERY``: any larger count gives the same answer."""
    return number % VAL_EVERY in (0, VAL_EVERY // 2) or number == test_offset(documents)
