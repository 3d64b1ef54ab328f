"""Reading a text file as UTF-8, for perplexity (``hf_geonorm.evaluation``) and training data
(``hf_geonorm.training.data``): a binary file is refused, bytes that are not UTF-8 are replaced with a warning."""

from __future__ import annotations

import codecs
import os
import warnings
from pathlib import Path


def read_text(path: str | os.PathLike, max_chars: int | None = None) -> str:
    """The UTF-8 text of ``path`` (its first ``max_chars`` characters).

    A binary file (one with NUL bytes) or an empty one is a ``ValueError``; bytes that are not UTF-8 are replaced
    by U+FFFD with a warning that names the file and counts them.
    """
    path = Path(path)
    limit = -1 if max_chars is None else max_chars * 4 + 4  # a UTF-8 character is at most 4 bytes
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
            complete = not f.read(1)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    if b"\0" in data:
        raise ValueError(f"{path} is a binary file (it holds NUL bytes), not text: give a UTF-8 text file")
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    text = decoder.decode(data, final=complete)
    bad = sum(1 for c in text if "\udc80" <= c <= "\udcff")
    if bad:
        text = "".join("\ufffd" if "\udc80" <= c <= "\udcff" else c for c in text)
        warnings.warn(
            f"{path} is not valid UTF-8: {bad} byte(s) were replaced by U+FFFD; convert it to UTF-8 first "
            "(e.g. iconv -f latin1 -t utf-8)",
            stacklevel=2,
        )
    if not text.strip():
        raise ValueError(f"{path} contains no text")
    return text if max_chars is None else text[:max_chars]
