"""The golden model cards of model_cards/golden/: the card ``hf-geonorm card`` writes for a tiny GPT-2, a tiny LLaMA
and a LLaMA converted from a tiny GGUF file, each converted by ``hf-geonorm convert`` from a stock folder (or the
``.gguf`` file) with the facts a user gives (license, base model). tests/sharing/test_golden_cards.py renders them
again and compares; after a change to the card that is meant, write them again from the repository root with

    PYTHONPATH=tests python -m support.golden_cards

and read the difference (``git diff model_cards/golden``) before committing it."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from hf_geonorm.sharing.model_card import FINGERPRINT_START

from support.helpers import succeeds
from support.tiny_gguf import write_tiny_gguf
from support.tiny_models import tiny_model

GOLDEN = Path(__file__).resolve().parents[2] / "model_cards" / "golden"
# each card's model: how its source is made, and the facts convert is given
MODELS = {
    "gpt2": ("gpt2", ["--license", "mit", "--base-model", "openai-community/gpt2"]),
    "llama": ("llama", ["--license", "apache-2.0", "--base-model", "meta-llama/Llama-3.2-1B"]),
    "gguf_llama": ("gguf", ["--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct"]),
}
# What a card holds that depends on where and when it is written rather than on the model, each replaced by a
# placeholder in the golden files and in the card compared with them: the hf-geonorm version that wrote it, the folder
# it was written in, and the fingerprint that closes the file (the sha256 of the text before it, which changes with
# either; the test checks it on the card as written).
VERSION = "`hf-geonorm` {version}"
FINGERPRINT = re.compile(re.escape(FINGERPRINT_START) + r" [0-9a-f]{64} -->")


def normalised(text: str, folder: Path) -> str:
    """``text`` with the hf-geonorm version, the folder ``folder`` is in and the fingerprint replaced."""
    installed = importlib.metadata.version("hf-geonorm")
    text = text.replace(VERSION.format(version=installed), VERSION.format(version="VERSION"))
    text = text.replace(str(folder.parent), "FOLDER")
    return FINGERPRINT.sub(f"{FINGERPRINT_START} SHA256 -->", text)


def written_card(name: str, work: Path) -> Path:
    """The README.md ``hf-geonorm card`` writes for the model ``name`` of ``MODELS``, made in the folder ``work``."""
    kind, facts = MODELS[name]
    work.mkdir(parents=True, exist_ok=True)
    if kind == "gguf":
        source = work / "tiny.gguf"
        write_tiny_gguf(source, metadata={"general.name": "Tiny GGUF LLaMA"})
    else:
        source = work / f"stock-{name}"
        tiny_model(kind).save_pretrained(source)
    folder = work / name
    succeeds("convert", source, folder, *facts)
    succeeds("card", folder)
    return folder / "README.md"


def render(name: str, work: Path) -> str:
    """The card of ``written_card``, normalised."""
    readme = written_card(name, work)
    return normalised(readme.read_text(encoding="utf-8"), readme.parent)


def main() -> None:
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for name in MODELS:
            (GOLDEN / f"{name}.md").write_text(render(name, Path(work) / name), encoding="utf-8")
            print(f"wrote {GOLDEN / f'{name}.md'}")


if __name__ == "__main__":
    main()
