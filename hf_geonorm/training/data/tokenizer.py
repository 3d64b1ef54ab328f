"""The tokenizer of a run, the second step of the data (documents, tokenizer, blocks): the ``--model`` folder's
own, ``--tokenizer``'s (a folder or a Hub id), or a byte-level BPE trained on the first documents of the corpus and
cached beside the blocks.

A cached tokenizer has its SHA-256 beside it (``tokenizer-*.json.sha256``, written with it): a file that does not
match is trained again with a warning, never used as it lies; one without a checksum (written by an earlier
version) is trained again once, and kept, its checksum written, when the training gives it byte for byte again
(training is deterministic).

Every user mistake (no such folder, a folder without tokenizer files, a Hub id that does not load, a tokenizer that
would not fit the model's rows) is a one-line ``ValueError`` that names it and the fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from ..._plumbing.checksums import file_sha256
from ...checkpoints.loading import NO_REMOTE_CODE, TOKENIZER_FILES, looks_like_path, open_source, standard_tokenizer
from ...errors import custom_code_error, first_line, needs_custom_code
from ..options import DEFAULT_TOKENIZER_VOCAB, LEGACY_HELD_OUT_RULE, TOKENIZER_SAMPLE_CHARS, trained_vocab_problem
from .cache_checks import check_cache_folder, storage_errors
from .corpus import FORMAT, Corpus

STANDARD_TOKENIZER_FIX = (
    "give a standard tokenizer (tokenizer.json, and a tokenizer_config.json without auto_map: what save_pretrained "
    "of a transformers tokenizer writes)"
)
# keys the cache: tokenizers that read held-out text (earlier versions read pieces of the files now held out whole)
# are not reused; with the held-out rule after the legacy one (whose key stays), whose candidate files differ
TOKENIZER_SAMPLE = "training documents only, whole candidate files left out"


def training_tokenizer(
    corpus: Corpus,
    model: str | None,
    tokenizer: str | None,
    vocab_size: int | None,
    cache: Path,
    builder: bool,
    log: Any,
    rule: int,
) -> tuple[Any, bool]:
    """The tokenizer the run trains with, and whether it is the ``model`` folder's own (``model_tokenizer``): else
    ``tokenizer``'s (``--tokenizer``), else one of ``vocab_size`` tokens (``tokenizer_vocab``) trained on the corpus
    without what the held-out ``rule`` may hold out, and cached under ``cache`` (``corpus_tokenizer``); one without a
    padding token pads with its end-of-text token."""
    folder = model_tokenizer(model, tokenizer, vocab_size)
    if folder is not None or tokenizer is not None:
        loaded = tokenizer_from(folder or tokenizer)
        check_given_fits(len(loaded), model, tokenizer, vocab_size)
    else:
        vocab = tokenizer_vocab(vocab_size, model)
        check_trained_fits(vocab, model, vocab_size)
        asked = ("--vocab-size" if vocab_size is not None else f"the vocab_size of --model {model}" if model is not None
                 else "the default tokenizer size (--vocab-size)")  # fmt: skip
        loaded = corpus_tokenizer(corpus, vocab, cache, builder, log, rule, asked)
    if loaded.pad_token is None:
        loaded.pad_token = loaded.eos_token
    return loaded, folder is not None


def check_given_fits(tokens: int, model: str | None, tokenizer: str | None, vocab_size: int | None) -> None:
    """``ValueError`` when a given tokenizer of ``tokens`` tokens (``--tokenizer``, or the ``model`` folder's own)
    has more than ``--vocab-size`` asks for, or than the embedding rows of a ``--model`` with trained weights: the
    ids beyond would be out of range at the first step."""
    if tokenizer is not None and vocab_size is not None and vocab_size < tokens:
        raise ValueError(
            f"--vocab-size {vocab_size} is smaller than the {tokens} tokens of --tokenizer {tokenizer}, and the model "
            "needs a row for each; drop --vocab-size (it sizes a tokenizer trained on the fly; with --tokenizer the "
            "model gets a row for each of its tokens)"
        )
    rows = trained_rows(model)
    if rows is None or tokens <= rows:
        return
    whose = f"the --tokenizer {tokenizer}" if tokenizer is not None else f"the tokenizer of --model {model}"
    raise ValueError(
        f"{whose} has {tokens} tokens, more than the {rows} rows of the embedding of --model {model} (its "
        f"vocab_size): token ids from {rows} on would be out of range; give the tokenizer the model was trained "
        f"with, or resize the model's embeddings to {tokens} rows first (model.resize_token_embeddings({tokens}), "
        "then save_pretrained)"
    )


def check_trained_fits(vocab: int, model: str | None, vocab_size: int | None) -> None:
    """``ValueError``, before any training, when a tokenizer trained on the fly of ``vocab`` tokens (``vocab_size``,
    ``--vocab-size``, or the default) would have more than the embedding rows of a ``--model`` with trained
    weights."""
    rows = trained_rows(model)
    if rows is None or vocab <= rows:
        return
    asked = "--vocab-size" if vocab_size is not None else "the default"
    raise ValueError(
        f"--model {model} has trained weights with {rows} embedding rows (its vocab_size), fewer than the {vocab} "
        f"tokens of the tokenizer the run would train on the data ({asked}): give --vocab-size {rows} or less, or "
        "--tokenizer with the tokenizer the model was trained with (its rows were learned for that one), or resize "
        "the model's embeddings first (model.resize_token_embeddings(N), then save_pretrained)"
    )


def trained_rows(model: str | None) -> int | None:
    """The embedding rows (``vocab_size``) of a ``--model`` folder with trained weights, or None: no folder, a config
    to train from scratch (its embedding is sized to the tokenizer), or a config without ``vocab_size``."""
    config = folder_config(model)
    if config is None or not has_trained_weights(model):
        return None
    rows = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    return rows if isinstance(rows, int) else None


def tokenizer_vocab(vocab_size: int | None, model: str | None) -> int:
    """The vocabulary of a tokenizer trained on the fly: ``vocab_size`` (``--vocab-size``), else the ``model``
    folder's from-scratch config's own ``vocab_size`` (``init --preset 125m``: 50,304, so the model is trained at the
    size it was written for), else ``DEFAULT_TOKENIZER_VOCAB``."""
    if vocab_size is not None:
        return vocab_size
    config = folder_config(model)
    if config is not None and not has_trained_weights(model) and config.get("vocab_size"):
        return int(config["vocab_size"])
    return DEFAULT_TOKENIZER_VOCAB


def folder_config(model: str | None) -> dict[str, Any] | None:
    """The ``config.json`` of the ``--model`` folder, as it is written (None without a folder or a config)."""
    if model is None:
        return None
    path = Path(model).expanduser() / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the loading names what is wrong with it


def has_trained_weights(folder: str) -> bool:
    """Whether a ``--model`` folder holds weights (a checkpoint: fine-tuned), not a config to train from scratch."""
    return bool(open_source(Path(folder).expanduser()).weight_files)


def model_tokenizer(model: str | None, tokenizer: str | None, vocab_size: int | None) -> str | None:
    """The ``model`` folder when it holds a tokenizer: the model is trained with it (its embedding rows are that
    tokenizer's). ``ValueError`` when ``tokenizer`` (``--tokenizer``) names another one or ``vocab_size``
    (``--vocab-size``) asks for a tokenizer trained on the fly, which would not fit the model's rows."""
    if model is None:
        return None
    folder = Path(model).expanduser()
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    if tokenizer is not None and Path(tokenizer).expanduser().absolute() != folder.absolute():
        raise ValueError(
            f"--tokenizer {tokenizer}: {model} has a tokenizer of its own, which its model's rows are "
            "for; drop --tokenizer (or give a model folder without one)"
        )
    if vocab_size is not None:
        raise ValueError(
            f"--vocab-size {vocab_size}: {model} has a tokenizer of its own, which the run trains "
            "with; drop --vocab-size (it sizes a tokenizer trained on the fly)"
        )
    return str(folder)


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
            tokenizer = AutoTokenizer.from_pretrained(path, **NO_REMOTE_CODE)
        except Exception as error:  # noqa: BLE001 - reported in one line
            if needs_custom_code(error):
                raise custom_code_error("tokenizer", spec, STANDARD_TOKENIZER_FIX) from None
            raise ValueError(f"cannot load the tokenizer in {spec}: {first_line(error)}") from None
        return standard_tokenizer(tokenizer, spec, STANDARD_TOKENIZER_FIX)
    if path.exists():
        raise ValueError(f"{spec} is a file; give the folder that holds the tokenizer, or a Hub model id")
    if looks_like_path(spec):
        raise ValueError(f"{spec}: no such folder; give a tokenizer folder or a Hub model id (such as gpt2)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec, **NO_REMOTE_CODE)
    except Exception as error:  # noqa: BLE001 - offline, unknown id, ...
        if needs_custom_code(error):
            raise custom_code_error("tokenizer", spec, STANDARD_TOKENIZER_FIX) from None
        raise ValueError(
            f"{spec} is not a local folder, and loading its tokenizer from the Hugging Face Hub failed: "
            f"{first_line(error)}"
        ) from None
    return standard_tokenizer(tokenizer, spec, STANDARD_TOKENIZER_FIX)


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


def checksum_file(path: Path) -> Path:
    """The file beside the cached tokenizer ``path`` that holds its SHA-256 (written with it)."""
    return path.with_name(path.name + ".sha256")


def cache_problem(path: Path) -> str | None:
    """Why the cached tokenizer ``path`` cannot be used as it lies, or None when its checksum matches."""
    try:
        recorded = checksum_file(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return "has no checksum (written by an earlier version)"
    except (OSError, UnicodeDecodeError) as error:
        return f"has a checksum file that cannot be read ({first_line(error)})"
    if file_sha256(path) != recorded:
        return "changed since it was trained (its checksum differs)"
    return None


def corpus_tokenizer(corpus: Corpus, vocab_size: int, cache: Path, builder: bool, log: Any, rule: int,
                     asked: str = "--vocab-size") -> Any:  # fmt: skip
    """A byte-level BPE tokenizer trained on the first ``TOKENIZER_SAMPLE_CHARS`` characters (whole documents) of
    the corpus's training documents under the held-out ``rule`` (``Corpus.tokenizer_sample``): training on all of a
    large corpus would take long and hold it in memory, for little gain. Cached under ``cache`` by the data, the
    vocabulary and the rule, so that a second run (and its cached blocks) finds the same one, and verified by its
    checksum (``cache_problem``); only the ``builder`` (the first process of a machine) trains it, the others wait
    for a file that verifies. A ``vocab_size`` (``asked`` says where it comes from) the sample or the machine cannot
    give is a ``ValueError`` before the tokenizers library would abort the process trying
    (``options.trained_vocab_problem``)."""
    check_cache_folder(cache)
    parts = [FORMAT, corpus.fingerprint, vocab_size, TOKENIZER_SAMPLE_CHARS, TOKENIZER_SAMPLE]
    parts += [] if rule == LEGACY_HELD_OUT_RULE else [rule]
    path = cache / f"tokenizer-{hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]}.json"
    if not builder:
        return _wait_for_verified(path)
    unchecked = None  # a cached file without a checksum: kept if training gives it again
    if path.is_file():
        problem = cache_problem(path)
        if problem is None:
            try:
                cached = fast_tokenizer(str(path))
            except Exception as error:  # noqa: BLE001 - a damaged file of the cache: trained again
                warnings.warn(f"the cached tokenizer {path} does not load ({first_line(error)}): it is trained again",
                              stacklevel=3)  # fmt: skip
            else:
                log(f"the byte-level BPE tokenizer ({vocab_size} tokens) trained on this data before, from {path}")
                return cached
        elif not checksum_file(path).exists():
            unchecked = path.read_bytes()
            log(f"the cached tokenizer {path} {problem}: training it again to check it")
        else:
            warnings.warn(f"the cached tokenizer {path} {problem}: it is trained again", stacklevel=3)
    sample, complete = corpus.tokenizer_sample(TOKENIZER_SAMPLE_CHARS, rule)
    chars = sum(map(len, sample))
    problem = trained_vocab_problem(vocab_size, sum(len(doc.encode("utf-8", "surrogatepass")) for doc in sample), asked)
    if problem is not None:
        raise ValueError(problem)
    what = "all of its training documents" if complete else "a sample: the first of its training documents"
    log(f"training a byte-level BPE tokenizer ({vocab_size} tokens) on {what} ({len(sample):,} documents, "
        f"{chars / 1e6:.1f} MB) of {corpus.label}; no document that validation or test may hold out is read")
    try:
        trained = train_tokenizer(sample, vocab_size)
    except BaseException as error:
        if type(error).__name__ != "PanicException":  # a Rust panic in the tokenizers library: pyo3's BaseException
            raise
        raise RuntimeError(f"the tokenizers library failed training a tokenizer of {vocab_size:,} tokens on "
                           f"{corpus.label}: {first_line(error)}") from None  # fmt: skip
    _save_with_checksum(trained, path, cache)
    if unchecked == path.read_bytes():
        log(f"the cached tokenizer {path} is the one this data trains, byte for byte: kept, its checksum written")
    elif unchecked is not None:
        warnings.warn(f"the cached tokenizer {path} (without a checksum) differs from the one this data trains: "
                      "replaced", stacklevel=3)  # fmt: skip
    return fast_tokenizer(str(path))  # as a later run loads it: the same digest keys the same cached blocks


def _save_with_checksum(tokenizer: PreTrainedTokenizerFast, path: Path, cache: Path) -> None:
    """Write the tokenizer to ``path`` and its SHA-256 beside it, each whole or not there (a killed run leaves no
    half file; one killed between the two leaves a checksum that does not match, and the tokenizer is trained
    again)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial_sum = path.with_name(f".{checksum_file(path).name}.{os.getpid()}")
    try:
        with storage_errors(cache):
            cache.mkdir(parents=True, exist_ok=True)
            tokenizer.backend_tokenizer.save(str(partial))
            partial_sum.write_text(file_sha256(partial) + "\n", encoding="utf-8")
            os.replace(partial, path)
            os.replace(partial_sum, checksum_file(path))
    finally:
        for leftover in (partial, partial_sum):  # there only when the save failed part way
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


def _wait_for_verified(path: Path, poll: float = 0.5) -> Any:
    """The cached tokenizer ``path`` once the builder of the run has written it and its checksum matches."""
    while not (path.is_file() and cache_problem(path) is None):
        time.sleep(poll)
    return fast_tokenizer(str(path))
