"""The documents tokenized in batches of bounded text (hf_geonorm.training.data.token_batches): a document's tokens are
the tokenizer's own for the whole document (``tokenizer(doc)``), whether it went to the tokenizer whole or in pieces; a
tokenizer for which pieces could change the tokens gets whole documents; batches hold bounded text, in order; and
worker processes and small batches build the blocks of the documented rules (tests/support/helpers.py)."""

from __future__ import annotations

import json
import random
import re
import sysconfig
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers

from hf_geonorm.training.data import token_batches
from hf_geonorm.training.data.corpus import resolve_corpus
from hf_geonorm.training.data.pipeline import ArrowBlocks, prepare_blocks
from hf_geonorm.training.data.token_batches import BATCH_CHARS, encode_documents, piece_cuts, text_batches
from hf_geonorm.training.data.tokenizer import fast_tokenizer, train_tokenizer

from support.helpers import marked_text, reference_blocks, reference_documents

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# Characters that meet at the cuts: ASCII and Unicode whitespace (Python's and the tokenizer's differ on some),
# letters, digits, punctuation, contractions, the end-of-text token and what starts it, CJK and an emoji.
PARTS = [*" \n\t\r\x0b\x0c\x1c\x85\xa0\u2028\u3000", *"'\"sStTdD0123456789.,;:!?()-_#@<>|aé中😀",
         "<|endoftext|>", "'s", "'ll", "  ", "\n\n", " \n", "\n ", " the", "\n    def"]  # fmt: skip
RULE = re.compile(r"[ \n](?=[!-;=-~])")  # the byte-level cut rule, before the end-of-text token's "<" is excluded


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([(STDLIB / name).read_text() for name in ("shlex.py", "textwrap.py")], 400)


def mixed_documents(count: int, seed: int = 0) -> list[str]:
    """Documents of about 4,000 to 12,000 characters drawn from ``PARTS``: many places to cut, of every kind."""
    rng = random.Random(seed)
    return ["".join(rng.choice(PARTS) for _ in range(rng.randint(2000, 6000))) for _ in range(count)]


def expected(tokenizer, docs: list[str], eos: list[int]) -> tuple[list[int], list[int]]:
    ids = [tokenizer(doc, add_special_tokens=False)["input_ids"] + eos for doc in docs]
    return [t for doc in ids for t in doc], [len(doc) for doc in ids]


def in_pieces(backend, doc: str) -> list[int]:
    """``doc``'s ids when it is cut at every place ``RULE`` allows."""
    bounds = [0, *(m.start() for m in RULE.finditer(doc) if m.start()), len(doc)]
    pieces = [doc[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    return [t for encoding in backend.encode_batch(pieces, add_special_tokens=False) for t in encoding.ids]


@pytest.mark.parametrize("piece_chars", [1, token_batches.ENCODE_PIECE_CHARS])
def test_documents_in_pieces_get_the_tokens_of_the_whole_documents(tokenizer, monkeypatch, piece_chars):
    """Cut at every place the rule allows (pieces of 1 character and more), and as the pipeline cuts."""
    monkeypatch.setattr(token_batches, "ENCODE_PIECE_CHARS", piece_chars)
    mixed = mixed_documents(40)
    docs = [*mixed, *reference_documents((STDLIB / "argparse.py").read_text())]
    cuts = piece_cuts(tokenizer.backend_tokenizer)
    assert cuts is not None
    assert sum(len(token_batches._pieces(doc, cuts)) for doc in mixed) > 3 * len(mixed)  # the pieces path is taken
    flat, lengths = encode_documents(docs, tokenizer, [tokenizer.eos_token_id])
    assert (flat.tolist(), lengths.tolist()) == expected(tokenizer, docs, [tokenizer.eos_token_id])


def changed(tokenizer, change: str) -> Tokenizer:
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    if change == "a prefix space":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    elif change == "a normalizer":
        backend.normalizer = normalizers.Replace(Regex(" +"), " ")
    else:
        backend.add_tokens([AddedToken("@@", rstrip=True)])
    return backend


@pytest.mark.parametrize("change", ["a prefix space", "a normalizer", "an added token that strips"])
def test_a_tokenizer_for_which_pieces_change_the_tokens_gets_whole_documents(tokenizer, change):
    backend = changed(tokenizer, change)
    docs = [doc.replace("#", "@@") for doc in mixed_documents(10, seed=1)]
    assert any(in_pieces(backend, doc) != backend.encode(doc, add_special_tokens=False).ids for doc in docs)
    assert piece_cuts(backend) is None
    fast = fast_tokenizer(backend)
    flat, lengths = encode_documents(docs, fast, [])
    assert (flat.tolist(), lengths.tolist()) == expected(fast, docs, [])


def test_batches_hold_bounded_text_in_order():
    rng = random.Random(0)
    docs = ["x" * rng.choice([10, 5_000, 300_000, 1_500_000]) + str(n) for n in range(60)]
    batches = list(text_batches(iter(docs)))
    assert [doc for batch in batches for doc in batch] == docs
    for batch in batches[:-1]:  # at least BATCH_CHARS, and under it before its last document
        assert sum(map(len, batch)) >= BATCH_CHARS > sum(map(len, batch[:-1]))


@pytest.mark.parametrize("shape", ["many documents", "seven documents"])
def test_small_batches_and_two_processes_build_the_blocks_of_the_documented_rules(tmp_path, monkeypatch, tokenizer,
                                                                                   shape):  # fmt: skip
    """Batches of one or two documents: the held-out documents are chosen across batches (the test offset waits
    for the 20th document, or the end of seven), and two processes return the batches in order."""
    monkeypatch.setattr(token_batches, "BATCH_CHARS", 3000)
    if shape == "many documents":
        path = tmp_path / "marked.txt"
        path.write_text(marked_text(200_000), encoding="utf-8")
        docs = reference_documents(path.read_text(encoding="utf-8"))
    else:
        path = tmp_path / "rows.jsonl"
        docs = [(STDLIB / name).read_text()[:2500] for name in ("shlex.py", "textwrap.py", "glob.py", "fnmatch.py",
                                                                   "bisect.py", "heapq.py", "random.py")]  # fmt: skip
        path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    train, val, _, _ = reference_blocks(tokenizer, docs, 32)
    built = []
    for workers in (1, 2):
        prepared = prepare_blocks(resolve_corpus(str(path)), tokenizer, 32, tmp_path / f"cache-{workers}", 64, workers)
        assert prepared.meta["documents"] == len(docs)
        blocks = ArrowBlocks(prepared.folder / "train.arrow", 32)
        assert [blocks[i]["input_ids"].tolist() for i in range(len(blocks))] == train
        assert prepared.val().blocks.tolist() == val
        built.append((prepared.folder / "train.arrow").read_bytes())
    assert built[0] == built[1]


def test_workers_start_with_sigterms_default_and_end_by_their_queue(tokenizer):
    """The pool's workers are forked with SIGTERM's default action, though the process raises on it
    (``terminate_raises``), and a block that ends well ends them by their queue, exit code 0, not by SIGTERM: a
    worker that SIGTERM reached as it started once swallowed the raise and waited for tasks for ever (a short
    block, as here, where one worker does every task while the other starts, is where that happened)."""
    import signal

    from hf_geonorm._plumbing.signals import terminate_raises

    with terminate_raises():
        for _ in range(5):
            with token_batches._tokenizer_pool(tokenizer, [0], 2) as pool:
                processes = list(pool._pool)
                assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)  # the process raises
                handlers = pool.map(signal.getsignal, [signal.SIGTERM] * 4, chunksize=1)
            assert handlers == [signal.SIG_DFL] * 4
            assert [process.exitcode for process in processes] == [0, 0]
