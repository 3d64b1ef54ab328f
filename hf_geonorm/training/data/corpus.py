"""What ``--data`` names, as a ``Corpus`` (the first step of the data: documents, tokenizer, blocks): an ordered
list of shards (files, or a ``datasets`` corpus) and the documents each holds, read in pieces so that no file is ever
held whole in memory (``documents``: what a document is).

What a file is, is read from its content where the name can mislead: a ``.json`` file of one object a line is
JSON lines (also after blank lines or a byte-order mark); a JSON array is refused by name. A folder written by
``save_to_disk`` (a ``Dataset``, or a ``DatasetDict``: its ``--data-split``) is read as a ``datasets`` corpus.
A folder's files are found by ``folders.folder_files`` (links to folders followed once). Hidden files and folders (a
name starting with ``.``) are skipped with a warning that counts them; the other files of a folder that are not read
(another extension, compressed, binary, a FIFO or device, a link to a folder read already or to one that holds it)
are named in a warning with why, and so are parquet rows whose text is null; a FIFO or device given as ``--data`` is
refused. A ``--text-column`` other than ``text`` on a corpus of plain text files only, which have no columns, is
refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..._plumbing.checksums import file_sha256
from ..._plumbing.text_files import BINARY_PROBE, not_text
from ...errors import first_line
from ..options import HELD_OUT_RULE, LEGACY_HELD_OUT_RULE
from .documents import (
    TEXT_TYPES,
    HubSource,
    check_csv,
    check_parquet,
    open_dataset,
    parquet_nulls,
    shard_documents,
)
from .folders import folder_files, special_kind, warn_skipped

ROW_SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet", ".csv": "csv"}
ROW_KINDS = ("jsonl", "parquet", "csv", "saved", "hub")  # the shards whose rows have columns
DEFAULT_COLUMN = "text"
SAVED_DATASET = ("dataset_info.json", "state.json")  # what Dataset.save_to_disk writes
SAVED_DATASET_DICT = "dataset_dict.json"  # what DatasetDict.save_to_disk writes, beside a folder per split
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".7z", ".tgz")
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".html", ".xml", ".c", ".h", ".js")
# Of the data caches (the tokenizer trained on the fly, the packed blocks): a new way of cutting documents or
# packing blocks gets new cache keys.
FORMAT = 6  # 5: meta.json records the Arrow files' checksums; 6: no document of whitespace only


def looks_like_path(spec: str) -> bool:
    """Whether ``spec`` names a local file or folder rather than a Hub name (``NAME`` or ``ORG/NAME``)."""
    return (
        spec.startswith((".", "/", "~"))
        or spec.count("/") > 1
        or (os.sep != "/" and os.sep in spec)
        or spec.lower().endswith((*TEXT_SUFFIXES, *ROW_SUFFIXES))
    )


def stdlib_files() -> list[Path]:
    """The Python standard library's own top-level source files, sorted: text every Python install has."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


@dataclass(frozen=True)
class Corpus:
    """The shards of ``--data`` in order, each ``(kind, path or name)`` with kind ``paragraphs`` (a text file given
    by name), ``file`` (a text file of a folder), ``jsonl``, ``parquet``, ``saved`` (a ``save_to_disk`` folder) or
    ``hub``; the rows' text column; a label for the log; and a fingerprint of the data that keys the cache and that a
    resumed run must match (its files' kinds, sizes and content hashes, ``content_key``; a ``datasets``
    corpus's name, config, split, revision and fingerprint)."""

    shards: tuple[tuple[str, str], ...]
    label: str
    fingerprint: str
    column: str = "text"
    hub: HubSource | None = None
    name: str | None = None  # the data as what is shared (a model card) names it, where ``label`` names a local path
    contents: tuple[tuple[int, str], ...] = ()  # of local shards: each one's bytes and SHA-256 (the fingerprint's)

    @property
    def shared_name(self) -> str:
        """The data's name without this machine's folders: a file's or folder's own name, else the label."""
        return self.name or self.label

    def documents(self, shard: int) -> Iterator[str]:
        """The documents of one shard, in order (``documents``: what a document is)."""
        kind, source = self.shards[shard]
        return shard_documents(kind, source, self.column, self.hub)

    def all_documents(self) -> Iterator[str]:
        """Every document of every shard, in order."""
        for _, doc in self.numbered_documents():
            yield doc

    def tokenizer_sample(self, chars: int, rule: int = HELD_OUT_RULE) -> tuple[list[str], bool]:
        """The first training documents up to ``chars`` characters, and whether that is all of them. Every document
        that validation or test may hold out is left out (``may_be_held_out`` by its number, and every document of
        a file that may be held out whole by the held-out ``rule``, ``held_out_files``: which way the data is held
        out depends on token counts, so both are), so that a tokenizer trained on the sample learns nothing of the
        text the runs are judged on (a string frequent there only never becomes a token). Which document is the test
        one in a corpus of fewer than ``VAL_EVERY`` depends on their count, so the documents are counted up to
        ``VAL_EVERY`` even past the sample."""
        files = held_out_files(self, rule)
        taken: list[tuple[int, str]] = []
        total, count, complete = 0, 0, True
        for number, (shard, doc) in enumerate(self.numbered_documents()):
            count = number + 1
            if total >= chars:
                complete = False
                if count > VAL_EVERY:
                    break
                continue
            if number % VAL_EVERY not in (0, VAL_EVERY // 2) and shard not in files:
                taken.append((number, doc))
                total += len(doc)
        return [doc for number, doc in taken if not may_be_held_out(number, count)], complete

    def numbered_documents(self) -> Iterator[tuple[int, str]]:
        """Every document of every shard, in order, with its shard's number."""
        for shard in range(len(self.shards)):
            yield from ((shard, doc) for doc in self.documents(shard))


def resolve_corpus(data: str | None, column: str = "text", hub: HubSource | None = None) -> Corpus:
    """The corpus ``data`` names: ``None`` (the standard library's source), a text, JSON lines, CSV or parquet file,
    a folder of such files, a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``, or a
    ``datasets`` name (``hub`` says which config, split and revision; with a config, a local folder is read as a
    ``datasets`` dataset too); a ``ValueError`` that names what is wrong otherwise. ``column`` is the rows' text
    column; another than ``DEFAULT_COLUMN`` is refused where no shard has rows (it would be ignored)."""
    corpus = _resolve(data, column, hub)
    if column != DEFAULT_COLUMN and not any(kind in ROW_KINDS for kind, _ in corpus.shards):
        raise ValueError(
            f"--text-column {column}: {corpus.label} holds plain text files only, which are read whole (a column is "
            "read from JSON lines, CSV, parquet and datasets rows); drop --text-column, or give the table"
        )
    return corpus


def _resolve(data: str | None, column: str, hub: HubSource | None) -> Corpus:
    if data is None:
        files = [p for p in stdlib_files() if p.stat().st_size > 0]
        return _local([("file", p) for p in files], f"the Python standard library's source ({len(files)} files)")
    path = Path(data).expanduser()
    source = HubSource(data) if hub is None else HubSource(data, hub.config, hub.split, hub.revision)
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise ValueError(f"{path} is {special_kind(path.stat().st_mode)}, not a file or folder: give a text file or "
                         "a folder")  # fmt: skip
    if path.is_file():
        kind = _file_kind(path, column)
        if path.stat().st_size == 0:
            raise ValueError(f"{path} contains no text")
        why = _not_text(path) if kind == "paragraphs" else None
        if why is not None:
            raise ValueError(f"{path} {why}")
        return _local([(kind, path)], str(path), column, name=path.name)
    if path.is_dir() and (path / SAVED_DATASET_DICT).is_file() and source.config is None:
        _check_saved_split(path, source.split)
        return _dataset_corpus(source, column, saved=True)
    if path.is_dir() and (all((path / name).is_file() for name in SAVED_DATASET) or source.config is not None):
        return _dataset_corpus(source, column, saved=source.config is None)
    if not path.is_dir():
        if looks_like_path(data):
            raise ValueError(f"{data}: no such file or folder")
        return _dataset_corpus(source, column, saved=False)
    return _folder_corpus(path, column)


def _check_saved_split(folder: Path, split: str) -> None:
    """``ValueError`` naming the splits when the ``DatasetDict`` saved in ``folder`` has no ``split``."""
    try:
        splits = json.loads((folder / SAVED_DATASET_DICT).read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # a damaged file: datasets names what is wrong when it opens the folder
    if split not in splits:
        raise ValueError(f"{folder} is a saved DatasetDict with the splits {', '.join(map(str, splits))}, not "
                         f"{split!r}: give one with --data-split")  # fmt: skip


def _folder_corpus(path: Path, column: str) -> Corpus:
    found = folder_files(path, (*TEXT_SUFFIXES, *ROW_SUFFIXES), _skipped_why)
    if found.hidden:
        warnings.warn(f"skipped {len(found.hidden)} hidden file(s) under {path} (names or folders starting with "
                      f"'.'), e.g. {found.hidden[0]}", stacklevel=3)  # fmt: skip
    files = [p for p in found.files if p.stat().st_size]
    kinds = {p: _file_kind(p, column) for p in files}
    skipped = found.skipped + [(p, why) for p in files if kinds[p] == "paragraphs" and (why := _not_text(p))]
    warn_skipped(path, skipped)
    unread = {p for p, _ in skipped}
    shards = [(kinds[p].replace("paragraphs", "file"), p) for p in files if p not in unread]
    if not shards:
        raise ValueError(
            f"{path} holds no text files ({', '.join((*TEXT_SUFFIXES, *ROW_SUFFIXES))}); give a folder of text files"
        )
    return _local(shards, f"{len(shards)} files under {path}", column, name=f"{len(shards)} files under {path.name}/")


def _skipped_why(path: Path) -> str:
    """Why a file of a data folder that is not read by its extension is skipped (and how to have it read)."""
    if path.suffix.lower() in COMPRESSED_SUFFIXES:
        return "compressed: decompress it to train on it"
    if not path.suffix:
        return f"no extension: name it {path.name}.txt to train on it as text"
    return f"{path.suffix} is not an extension read as text: rename it .txt to train on it"


def _file_kind(path: Path, column: str) -> str:
    """What a file holds: ``jsonl``, ``parquet``, ``csv`` (their text column checked) or text (``paragraphs``). A
    ``.json`` file is JSON lines when its first line that is not blank is one JSON object (after a byte-order mark);
    a JSON array or an object over many lines is refused."""
    kind = ROW_SUFFIXES.get(path.suffix.lower(), "paragraphs")
    if kind == "parquet":
        check_parquet(path, column)
        nulls, rows = parquet_nulls(path, column)
        if nulls:
            warnings.warn(f"skipped {nulls} of the {rows} rows of {path}: their {column!r} is null (no text)",
                          stacklevel=3)  # fmt: skip
    if kind == "csv":
        check_csv(path, column)
    if path.suffix.lower() != ".json":
        return kind
    first = _first_line(path)
    if first.startswith("["):
        raise ValueError(f"{path} is a JSON array: give JSON lines (one object a line, each with a {column!r} string)")
    try:
        return "jsonl" if isinstance(json.loads(first), dict) else "paragraphs"
    except json.JSONDecodeError:
        if first.startswith("{"):
            raise ValueError(f"{path} is one JSON object over many lines: give JSON lines (one object a line, each "
                             f"with a {column!r} string)") from None  # fmt: skip
        return "paragraphs"


def _first_line(path: Path, limit: int = 1 << 20) -> str:
    """The first line of ``path`` that is not blank, stripped (without a byte-order mark), read from its first
    ``limit`` bytes."""
    with open(path, "rb") as f:
        head = f.read(limit).decode("utf-8", "replace").removeprefix("\ufeff")
    return next((line.strip() for line in head.splitlines() if line.strip()), "")


def _not_text(path: Path) -> str | None:
    """Why ``path`` is not a UTF-8 text file (``text_files.not_text``), or None."""
    try:
        with open(path, "rb") as f:
            return not_text(f.read(BINARY_PROBE))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}; make it readable (chmod u+r) or move it "
                         "out of the data") from None  # fmt: skip


def content_key(kinds: Iterable[str], contents: Iterable[tuple[int, str]]) -> str:
    """The key of local shards: in order, each one's kind, size and content hash (not its path or mtime)."""
    parts = [(kind, size, sha256) for kind, (size, sha256) in zip(kinds, contents, strict=True)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _local(shards: list[tuple[str, Path]], label: str, column: str = "text", name: str | None = None) -> Corpus:
    contents = tuple((path.stat().st_size, file_sha256(path)) for _, path in shards)
    key = content_key((kind for kind, _ in shards), contents)
    digest = hashlib.sha256(json.dumps([key, column]).encode()).hexdigest()
    return Corpus(tuple((kind, str(p.absolute())) for kind, p in shards), label, digest, column, name=name,
                  contents=contents)  # fmt: skip


def _dataset_corpus(source: HubSource, column: str, saved: bool) -> Corpus:
    """A ``datasets`` corpus, checked before any work: it opens, and its rows have the text column as strings."""
    try:
        rows = open_dataset(source, saved)
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
    name = f"the saved datasets folder {Path(source.name).name!r}{part}" if saved else None
    return Corpus(((kind, source.name),), f"the datasets corpus {source.name!r}{part}", digest, column, source, name)


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


# One unit in VAL_EVERY (in corpus order: a whole file of a folder, else a document) is held out for validation
# and as many for test (``split``).
VAL_EVERY = 20
MIN_FILES = 3  # whole files are held out of a folder of at least this many text files (``split``)
VAL, TEST = 1, 2


def test_offset(units: int) -> int:
    """The first test unit: the 10th, or the middle one of a corpus of fewer than ``VAL_EVERY`` units."""
    return min(VAL_EVERY // 2, units // 2)


def candidate_split(number: int, units: int) -> int:
    """Which split unit ``number`` of ``units`` (files or documents) is a candidate of: ``VAL`` (every
    ``VAL_EVERY``-th from the first), ``TEST`` (every ``VAL_EVERY``-th from ``test_offset``), else 0. ``units``
    need only be known up to ``VAL_EVERY``."""
    if number % VAL_EVERY == 0:
        return VAL
    return TEST if number % VAL_EVERY == test_offset(units) else 0


def may_be_held_out(number: int, documents: int) -> bool:
    """Whether document ``number`` of a corpus of ``documents`` may be a validation or test one when documents are
    held out, whatever the tokenizer (how many of the candidates are taken depends on their token counts): every
    ``VAL_EVERY``-th from the first and from the ``VAL_EVERY // 2``-th, and the test offset of a small corpus.
    ``documents`` need only be known up to ``VAL_EVERY``: any larger count gives the same answer."""
    return number % VAL_EVERY in (0, VAL_EVERY // 2) or number == test_offset(documents)


def by_files(corpus: Corpus) -> bool:
    """Whether whole files are the units held out: a folder of at least ``MIN_FILES`` text files (or the standard
    library's), none of them a table of rows."""
    return len(corpus.shards) >= MIN_FILES and all(kind == "file" for kind, _ in corpus.shards)


def candidate_files(corpus: Corpus, rule: int) -> list[tuple[int, int]]:
    """The files that may be held out whole (when the data is held out by files), in the order the splits take
    them, each as (shard, ``VAL`` or ``TEST``): ``candidate_split`` of its rank, the files ranked by the SHA-256 of
    their content (then their path), so that the same files give the same split whatever they are named or listed
    in; under ``LEGACY_HELD_OUT_RULE``, by their path."""
    if not by_files(corpus):
        return []
    units = len(corpus.shards)
    order = list(range(units))
    if rule != LEGACY_HELD_OUT_RULE:
        order.sort(key=lambda shard: (corpus.contents[shard][1], corpus.shards[shard][1]))
    return [(shard, split) for rank, shard in enumerate(order) if (split := candidate_split(rank, units))]


def held_out_files(corpus: Corpus, rule: int) -> set[int]:
    """The files (shard numbers) that may be held out whole under the held-out ``rule`` (``candidate_files``)."""
    return {shard for shard, _ in candidate_files(corpus, rule)}
