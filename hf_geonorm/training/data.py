"""What ``hf-geonorm train`` reads: text (files, a folder, a ``datasets`` corpus, or the Python standard library's
own source), a tokenizer (loaded, or a byte-level BPE trained on the text), and fixed-length blocks of token ids.

Every user mistake (no such file, a binary file, a tokenizer that is not there) is a one-line ``ValueError`` that
names the file and the fix; text that is not UTF-8 is read with a warning that names the file.
"""

from __future__ import annotations

import os
import sysconfig
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerFast

from ..loading import NO_REMOTE_CODE, TOKENIZER_FILES, custom_code_error, first_line, needs_custom_code
from ..text_files import read_text

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".csv", ".html", ".xml", ".c", ".h", ".js")


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


STANDARD_TOKENIZER_FIX = (
    "give a standard tokenizer (tokenizer.json, and a tokenizer_config.json without auto_map: what save_pretrained "
    "of a transformers tokenizer writes)"
)


def tokenizer_from(spec: str) -> Any:
    """The tokenizer in folder ``spec``, or of Hub model ``spec``, never with code of its own; a ``ValueError`` that
    says which it was taken for and what is wrong (no such folder, a folder without tokenizer files, a tokenizer
    that needs custom code, a Hub id that does not load)."""
    from transformers import AutoTokenizer

    path = Path(spec).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(f"{spec} holds no tokenizer ({' or '.join(TOKENIZER_FILES[:2])}); give a tokenizer folder")
        try:
            return AutoTokenizer.from_pretrained(path, **NO_REMOTE_CODE)
        except Exception as error:  # noqa: BLE001 - reported in one line
            if needs_custom_code(error):
                raise custom_code_error("tokenizer", spec, STANDARD_TOKENIZER_FIX) from None
            raise ValueError(f"cannot load the tokenizer in {spec}: {first_line(error)}") from None
    if path.exists():
        raise ValueError(f"{spec} is a file; give the folder that holds the tokenizer, or a Hub model id")
    if looks_like_path(spec):
        raise ValueError(f"{spec}: no such folder; give a tokenizer folder or a Hub model id (such as gpt2)")
    try:
        return AutoTokenizer.from_pretrained(spec, **NO_REMOTE_CODE)
    except Exception as error:  # noqa: BLE001 - offline, unknown id, ...
        if needs_custom_code(error):
            raise custom_code_error("tokenizer", spec, STANDARD_TOKENIZER_FIX) from None
        raise ValueError(
            f"{spec} is not a local folder, and loading its tokenizer from the Hugging Face Hub failed: "
            f"{first_line(error)}"
        ) from None


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` (GPT-2's scheme), with one end-of-text token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return fast_tokenizer(tokenizer)


def fast_tokenizer(tokenizer: Any) -> PreTrainedTokenizerFast:
    """transformers' tokenizer over a ``tokenizers`` one (or its JSON file) made by ``train_tokenizer``."""
    source = {"tokenizer_file": tokenizer} if isinstance(tokenizer, str) else {"tokenizer_object": tokenizer}
    return PreTrainedTokenizerFast(
        **source, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


class TokenBlocks(Dataset):
    """Fixed-length blocks of token ids; each is its own label (the model shifts)."""

    def __init__(self, blocks: torch.Tensor) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


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
