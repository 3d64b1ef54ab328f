"""The old in-memory data path, which only the benchmarks' own training loop still reads (``benchmarks/run_loop.py``):
documents read into a list (``read_texts``), tokenized into one tensor of fixed-length blocks (``token_blocks``)
and its last blocks held out for validation (``split_blocks``). ``hf-geonorm train`` reads its data through
``corpus``, ``tokenizer`` and ``pipeline`` instead.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from ..errors import first_line
from ..files.text_files import read_text
from .corpus import TEXT_SUFFIXES, looks_like_path, stdlib_files


def read_texts(data: str | None, max_chars: int) -> tuple[list[str], str]:
    """The documents of ``data`` (a text file, a folder of text files, or a ``datasets`` name) and a label.

    ``None`` reads the standard library's source. Reading stops after ``max_chars`` characters. A binary or
    empty file given by name is an error; in a folder such files are skipped (binary ones with a warning).
    """
    if data is None:
        files, label = stdlib_files(), "the Python standard library's source"
    else:
        path = Path(data).expanduser()
        if path.is_file():
            return [read_text(path, max_chars)], str(path)
        if not path.is_dir():
            return _dataset_texts(data, max_chars), f"the datasets corpus {data!r}"
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        label = f"{len(files)} text files under {path}"
        if not files:
            raise ValueError(f"{data} holds no text files ({', '.join(TEXT_SUFFIXES)}); give a folder of text files")
    texts, total, binary = [], 0, []
    for file in files:
        if file.stat().st_size == 0:
            continue
        try:
            text = read_text(file, max_chars - total)
        except ValueError:
            binary.append(file)
            continue
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    if binary:
        more = f" and {len(binary) - 1} more" if len(binary) > 1 else ""
        warnings.warn(f"skipped {binary[0]}{more}: binary or without text (give UTF-8 text files)", stacklevel=2)
    if total == 0:
        raise ValueError(f"no text in {label}")
    return texts, label


def _dataset_texts(name: str, max_chars: int) -> list[str]:
    if looks_like_path(name):
        raise ValueError(f"{name}: no such file or folder")
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"{name}: no such file or folder here; as a datasets corpus name it needs `pip install datasets`"
        ) from None
    try:
        corpus = datasets.load_dataset(name, split="train", streaming=True)
    except Exception as error:  # noqa: BLE001 - offline, unknown name, ...
        raise ValueError(f"{name}: no such file or folder, and no datasets corpus ({first_line(error)})") from None
    texts, total = [], 0
    for row in corpus:
        text = row.get("text") if isinstance(row, dict) else None
        if not text:
            continue
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return texts


def token_blocks(tokenizer: Any, texts: list[str], seq_len: int) -> torch.Tensor:
    """All documents joined by the end-of-text token and cut into ``seq_len`` blocks (the tail dropped)."""
    separator = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.extend(separator)
    count = len(ids) // seq_len
    if count < 2:
        raise ValueError(f"the data gives {len(ids)} tokens, fewer than two blocks of --seq-len {seq_len}")
    return torch.tensor(ids[: count * seq_len], dtype=torch.long).view(count, seq_len)


def split_blocks(blocks: torch.Tensor, val_fraction: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """The last blocks (at least one, at most 64) are validation; the rest train."""
    n_val = min(64, max(1, int(len(blocks) * val_fraction)))
    return blocks[:-n_val], blocks[-n_val:]
