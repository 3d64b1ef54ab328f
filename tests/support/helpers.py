"""Helpers more than one test file uses, imported by name (``from support.helpers import fails, train``).

- Text to train on: ``STDLIB``, ``stdlib_text``, ``words``, ``rows``.
- The command line as a user meets it: ``invoke``, ``train``, ``train_in``, ``succeeds``, ``fails``,
  ``error_lines``, ``logged``; a folder's files (``contents``); a checkpoint with edited tensors (``edited_copy``);
  a GeoNorm folder whose card knows its lineage (``saved_with_lineage``).
- A sweep's journal written by hand (``write_sweep_journal``) and a training run stopped by a real signal
  (``stopped_run``).
- A Python without the plugin for remote-code tests (``PluginFreePython``; the ``plugin_free_python`` fixture of
  conftest.py makes one; ``plugin_free_environment`` opens the oldest and newest transformers' environments), and
  a snippet's JSON from a fresh Python (``json_from_child``).
- Rules written out from the docs, independently of the code: the data pipeline's documents, blocks and held-out
  split (``reference_documents``, ``reference_blocks``, ``held_out``), Welch's test (``welch_written_out``) and the
  learning-rate schedule (``written_factor``).

conftest.py holds the fixtures and hooks only, and sets the caches' environment variables before anything here
imports transformers."""

from __future__ import annotations

import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from safetensors.torch import load_file, save_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def stdlib_text(tmp_path_factory: pytest.TempPathFactory, *names: str) -> Path:
    """A new text file holding the standard library's files ``names`` one after the other: real text to train on."""
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("".join((STDLIB / name).read_text() for name in names))
    return path


# ---- the command line, as a user meets it ----


def invoke(*args: object) -> Any:
    """``hf-geonorm ARGS`` in this process (click's CliRunner); its result, whatever the exit status."""
    from click.testing import CliRunner

    from hf_geonorm_cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def skip_where_train_refuses() -> None:
    """Skip, saying why, where ``hf-geonorm train`` refuses the installed transformers (below 5.23; the modelling
    tests also run under the range's oldest release, in .ci/run): tests/modeling/test_transformers_versions.py checks
    the refusal itself."""
    from hf_geonorm.modeling.transformers_versions import INSTALLED, INSTALLED_VERSION
    from hf_geonorm.training.options import OLDEST_TRANSFORMERS

    if INSTALLED < OLDEST_TRANSFORMERS:
        needed = ".".join(map(str, OLDEST_TRANSFORMERS))
        pytest.skip(f"hf-geonorm train refuses transformers {INSTALLED_VERSION}: it needs {needed}")


def train(*args: object) -> Any:
    """``hf-geonorm train ARGS``; its result, whatever the exit status."""
    return invoke("train", *args)


ONE_STEP = ["--seq-len", "64", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--max-steps", "1",
            "--eval-every", "1", "--eval-blocks", "8"]  # fmt: skip


def train_in(tmp_path: Path, data: Path | str, *more: object, name: str = "run") -> Any:
    """One training step on ``data`` (seq-len 64 blocks, evaluated once on 8 of them) into ``tmp_path / name``, with
    the data cache in ``tmp_path / "cache"``; its result, whatever the exit status."""
    return train("--data", data, *ONE_STEP, "--data-cache", tmp_path / "cache", "--output", tmp_path / name, *more)


def fails(*args: object, code: int | None = None) -> str:
    """A command that must fail with a one-line error, a non-zero exit (``code`` where given) and no traceback;
    returns that last line."""
    result = invoke(*args)
    assert result.exit_code != 0, result.output
    assert code is None or result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    last = result.output.rstrip().splitlines()[-1]
    assert last.startswith("Error:"), result.output
    return last


def error_lines(output: str) -> list[str]:
    """The ``Error: ...`` lines of the output (a progress bar may precede one on its line)."""
    return [line[line.index("Error:") :] for line in output.splitlines() if "Error:" in line]


def contents(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` by its relative path, with its bytes: equal before and after means untouched."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def edited_copy(source: Path, target: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> Path:
    """A copy of the checkpoint folder ``source`` whose tensors ``edit`` changed (a dict, in place)."""
    shutil.copytree(source, target)
    tensors = load_file(source / "model.safetensors")
    edit(tensors)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


# ---- a sweep's journal written by hand ----


def write_sweep_journal(path: Path, options: Any, runs: list[Any]) -> None:
    """``path`` (a runs.jsonl) as `hf-geonorm sweep` writes it for the runs of ``options`` (a ``TrainOptions``): its
    header with the sweep's identity measured as the sweep measures it (the data's source resolved, its tokenizer
    trained on the fly and cached where the tests cache data), then each run; a run given as a dict is completed
    with the identity fields it leaves out (its settings over the shared ones), a str is written as it is (any other
    value as its JSON)."""
    from hf_geonorm.sweep.record import sweep_header, sweep_identity
    from hf_geonorm.training.data.prepare import data_request, data_source

    source = data_source(data_request(options), lambda _: None)
    identity = sweep_identity(options, source.corpus.fingerprint, source.tokenizer_hash)
    facts = {"fingerprint": source.corpus.fingerprint, "tokenizer": source.tokenizer_hash}
    lines = [json.dumps(sweep_header(identity, {}))]
    for run in runs:
        if isinstance(run, dict):
            trained = run.get("val_loss") is not None
            completed = {"role": "grid", "train_options": identity["train_options"], "data": facts if trained else None,
                         "fingerprints": identity["fingerprints"], **run}  # fmt: skip
            if isinstance(run.get("settings"), dict):
                completed["settings"] = {**identity["settings"], **run["settings"]}
            run = completed
        lines.append(run if isinstance(run, str) else json.dumps(run))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


# ---- a training run stopped by a real signal ----

STOP_MARK = "STOPPED BEFORE WRITING"


def _stopping_child(args: list[str], stop_at_save: int, cwd: Path, out: int) -> None:
    """In a forked child: ``hf-geonorm train ARGS`` as the command runs it (its own stdout and stderr, the default
    signal handlers), with transformers' safetensors writer wrapped so that the ``stop_at_save``-th weights file
    announces itself on ``out`` and waits for the test's signal. Never returns."""
    code = 1
    try:
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # the child's own
        sys.stdin = open(os.devnull)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a new process's handlers, not the test runner's
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(cwd)
        os.environ.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
        import transformers.modeling_utils as modeling_utils

        from hf_geonorm_cli.main import cli

        calls, write = [0], modeling_utils.safe_save_file

        def save_file(*save_args: Any, **kwargs: Any) -> Any:  # the n-th weights file: say so, then wait
            calls[0] += 1
            if calls[0] == stop_at_save:
                print(STOP_MARK, save_args[1], flush=True)
                time.sleep(600)
            return write(*save_args, **kwargs)

        modeling_utils.safe_save_file = save_file
        cli(["train", *args])
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # shown in the output the test reads, as a child's traceback would be
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)  # no atexit handlers of the test process (they remove its caches)


def stopped_run(
    args: list[str], stop_at_save: int, sig: int, cwd: Path, before_signal: Callable[[], None] | None = None
) -> tuple[int, str]:
    """Run ``hf-geonorm train ARGS`` in a child process, send ``sig`` when it is about to write its
    ``stop_at_save``-th weights file (after calling ``before_signal``); return its exit status (minus the signal
    where one ended it, as ``subprocess`` gives it) and its output.

    The child is a fork of this process, so it starts with torch, transformers and the command already imported
    (a new interpreter spends most of a tiny run importing them); the signal is a real one, to a process of its own.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _stopping_child([str(a) for a in args], stop_at_save, cwd, write_end)
    os.close(write_end)
    output_file = open(read_end, errors="replace")  # closed below
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, output_file), lines.put(None)], daemon=True).start()

    def wait(seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        raise subprocess.TimeoutExpired("the stopped child", seconds)

    seen = []
    try:
        while (line := lines.get(timeout=300)) is not None:
            seen.append(line)
            if STOP_MARK in line:  # after a progress bar's carriage return, on the same line
                if before_signal is not None:
                    before_signal()
                os.kill(pid, sig)
                break
        status = wait(120)
    except (queue.Empty, subprocess.TimeoutExpired):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the child did not stop or end in time:\n" + "".join(seen)[-3000:]) from None
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    output_file.close()
    output = "".join(seen)
    assert STOP_MARK in output, f"the child ended before its weights file {stop_at_save}:\n{output[-3000:]}"
    return status, output


CHILD_PROLOGUE = '''
import importlib.abc, json, sys


class BlockThePlugin(importlib.abc.MetaPathFinder):
    """Refuses hf_geonorm even where it is installed as a regular package (not only as an editable hook)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hf_geonorm", "hf_geonorm_cli"):
            raise ModuleNotFoundError(f"{name} is blocked in this test")


sys.meta_path.insert(0, BlockThePlugin())
import torch
import transformers.dynamic_module_utils

transformers.dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0  # no prompt: refuse at once
torch.set_num_threads(1)
job = json.loads(open(sys.argv[1]).read())
report, results = {}, {}
'''
CHILD_EPILOGUE = """
from safetensors.torch import save_file

report["hf_geonorm_imported"] = any(name.split(".")[0] == "hf_geonorm" for name in sys.modules)
save_file({f"{name}/{key}": value.contiguous() for name, values in results.items() for key, value in values.items()},
          sys.argv[2])
with open(sys.argv[3], "w") as out:
    json.dump(report, out)
"""


class PluginFreePython:
    """Runs code where hf_geonorm cannot be imported, with remote-code prompts off and stdin closed.

    ``run(code, job, workdir)`` executes ``code`` with ``job`` (JSON data) defined; the code fills ``report``
    (JSON data) and ``results`` (name -> {key: tensor}), which come back as ``(report, results)``. The run
    must exit 0 and must not have imported hf_geonorm.
    """

    def __init__(self, python: Path) -> None:
        self.python = python

    def run(
        self, code: str, job: dict, workdir: Path, env: dict[str, str] | None = None, timeout: int = 300
    ) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
        workdir.mkdir(parents=True, exist_ok=True)
        script, job_file = workdir / "child.py", workdir / "job.json"
        results_file, report_file = workdir / "results.safetensors", workdir / "report.json"
        script.write_text(CHILD_PROLOGUE + textwrap.dedent(code) + CHILD_EPILOGUE)
        job_file.write_text(json.dumps(job))
        child_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        child_env.update({
            "HF_HOME": str(workdir / "hf_home"),
            "HF_MODULES_CACHE": str(workdir / "modules"),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": "",
            "TRANSFORMERS_VERBOSITY": "error",
        })  # fmt: skip
        child_env.update(env or {})
        done = subprocess.run(
            [str(self.python), str(script), str(job_file), str(results_file), str(report_file)],
            cwd=workdir,
            env=child_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads(report_file.read_text())
        assert not report.pop("hf_geonorm_imported"), "the plugin-free child imported hf_geonorm"
        results: dict[str, dict[str, torch.Tensor]] = {}
        for flat, value in load_file(results_file).items():
            name, _, key = flat.rpartition("/")
            results.setdefault(name, {})[key] = value
        return report, results


# ---- sweeps ----

# a sweep's runs at their smallest, and the protocol before issue 54: the grid given, one seed
TINY = ["--seq-len", "32", "--batch-size", "4", "--vocab-size", "300", "--max-steps", "3", "--eval-every", "3",
        "--warmup-steps", "0", "--eval-blocks", "8"]  # fmt: skip
FIXED = ["--extend", "0", "--confirm-seeds", "none"]


# ---- runs and folders a new user makes ----

SHORT_RUN = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "2", "--warmup-steps", "0", "--lr", "1e-3"]
LINEAGE = {"license": "mit", "source": "some/original", "base_model": "org/base-model", "language": "en"}


def succeeds(*args: object) -> str:
    """A command that must succeed; its output."""
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of 300 tokens trained on textwrap.py, with one end-of-text token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator((STDLIB / "textwrap.py").read_text().splitlines(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def saved_with_lineage(folder: Path) -> Path:
    """A GeoNorm GPT-2 folder whose card knows its license, source, base model and language (as convert writes it)."""
    import hf_geonorm
    from hf_geonorm.sharing.hub import save_shareable
    from hf_geonorm.sharing.model_card import CardInfo

    config = hf_geonorm.GeoNormGPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=320, n_positions=64,
                                          bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = hf_geonorm.GeoNormGPT2ForCausalLM(config)
    save_shareable(model, folder, tokenizer=bpe_tokenizer(), card_info=CardInfo(**LINEAGE))
    return folder


# ---- text like a user's data ----


def logged(output: str, pattern: str) -> int:
    """The number the log line matching ``pattern`` gives (its first group, with thousands separators)."""
    match = re.search(pattern, output)
    assert match, output
    return int(match.group(1).replace(",", ""))


def words(count: int, start: int = 0) -> str:
    """``count`` words of the standard library's prose, from ``start`` on (wrapping around)."""
    found = re.findall(r"[a-z]+", (STDLIB / "textwrap.py").read_text())
    return " ".join(found[(start + n) % len(found)] for n in range(count))


def rows(count: int, size: int = 300) -> list[str]:
    """``count`` numbered rows of about ``size`` characters of prose."""
    return [f"row {n}: {words(size // 6, 7 * n)}" for n in range(count)]


# ---- the data pipeline's rules, written out from docs/training.md ----


def reference_documents(text: str) -> list[str]:
    """The documents of one text file as documented: cut before a non-blank line that follows a blank line, once
    the document holds at least 1,000 characters, and at a line end once it holds 8,000."""
    docs, current, after_blank = [], "", False
    for line in re.findall(r"[^\n]*\n|[^\n]+$", text):
        blank = not line.strip()
        if current and ((not blank and after_blank and len(current) >= 1000) or len(current) >= 8000):
            docs.append(current)
            current = ""
        current += line
        after_blank = blank
    return [*docs, current]


def held_out(lengths: list[int], first: int, budget: int) -> list[int]:
    """Documents first, first + 20, ... while the ones before hold fewer than ``budget`` tokens."""
    chosen, held = [], 0
    for index in range(first, len(lengths), 20):
        if held >= budget:
            break
        chosen.append(index)
        held += lengths[index]
    return chosen


def kept_tokens(lengths: list[int], chosen: list[int], budget: int) -> dict[int, int]:
    """The tokens held out of each chosen document: all of them, but of one longer than ``budget`` only what the
    budget still needs (the rest trains)."""
    kept, before = {}, 0
    for index in chosen:
        kept[index] = lengths[index] if lengths[index] <= budget else budget - before
        before += lengths[index]
    return kept


def reference_blocks(tokenizer, docs: list[str], seq_len: int) -> tuple[list[list[int]], list[list[int]], int, int]:
    """Training and validation blocks by the documented rules: the end-of-text token after every document;
    documents 0, 20, 40, ... are validation and 10, 30, 50, ... test (the middle one of fewer than 20), each until
    they hold 64 blocks' tokens (one longer than that cut: ``kept_tokens``); at most 64 validation blocks, a
    multiple of 8 from 8 on. Also the data's tokens and the held-out (validation and test) tokens."""
    ids = [tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for doc in docs]
    lengths = [len(doc) for doc in ids]
    budget = 64 * seq_len
    val = held_out(lengths, 0, budget)
    test = [i for i in held_out(lengths, min(10, len(ids) // 2), budget) if i not in val]
    kept = {**kept_tokens(lengths, val, budget), **kept_tokens(lengths, test, budget)}
    train = [t for i, doc in enumerate(ids) for t in doc[kept.get(i, 0) :]]
    val_ids = [t for i in val for t in ids[i][: kept[i]]]

    def cut(tokens: list[int]) -> list[list[int]]:
        return [tokens[s : s + seq_len] for s in range(0, len(tokens) - seq_len + 1, seq_len)]

    evaluated = min(64, len(cut(val_ids)))
    held = sum(kept.values())
    return cut(train), cut(val_ids)[: evaluated - evaluated % 8 or evaluated], sum(lengths), held


def marked_text(size: int) -> str:
    """About ``size`` characters of the standard library's source, each paragraph after a marker line of its own
    (``#@ 000123``), so that where a paragraph went can be read from decoded blocks."""
    paragraphs: list[str] = []
    for path in sorted(STDLIB.glob("*.py")):
        paragraphs += [p for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
        if sum(map(len, paragraphs)) > size:
            break
    return "".join(f"#@ {n:06d}\n{p}\n\n" for n, p in enumerate(paragraphs))


# ---- statistics written out: Welch's t-test, its p by integrating Student's t density ----


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def variance(values: list[float]) -> float:
    centre = mean(values)
    return sum((v - centre) ** 2 for v in values) / (len(values) - 1)


def t_density(x: float, df: float) -> float:
    log_scale = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_scale - (df + 1) / 2 * math.log1p(x * x / df))


def p_by_integration(t: float, df: float, intervals: int = 20_000) -> float:
    """Two-sided p: 1 - 2 x the density's integral from 0 to |t| (Simpson's rule)."""
    h = abs(t) / intervals
    total = t_density(0, df) + t_density(abs(t), df)
    total += sum((4 if i % 2 else 2) * t_density(i * h, df) for i in range(1, intervals))
    return 1 - 2 * total * h / 3


def welch_written_out(a: list[float], b: list[float]) -> tuple[float, float, float, float]:
    """mean(a) - mean(b), its standard error, Welch-Satterthwaite's degrees of freedom and the two-sided p."""
    va, vb = variance(a) / len(a), variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    margin = mean(a) - mean(b)
    return margin, se, df, p_by_integration(margin / se, df)


# ---- the learning-rate schedule, written out ----


def written_factor(step: int, warmup: int, total: int, floor: float) -> float:
    """The schedule, written out: linear warm-up with the first step at 1/warmup, then cosine to ``floor``."""
    if step < warmup:
        return (step + 1) / warmup
    return floor + (1 - floor) * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))) / 2


def json_from_child(code: str, *args: str, cwd: Path, python: Path | str = sys.executable,
                    env: dict[str, str] | None = None) -> Any:  # fmt: skip
    """``code`` run in a fresh Python (``python -c code ARGS``, offline, one thread, the environment's variables plus
    ``env``); its last output line, read as JSON."""
    child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run([str(python), "-c", code, *args], cwd=cwd, env=child_env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# What an environment holds, and whether hf_geonorm could be imported there at all (it must not be).
ENVIRONMENT_PROBE = """
import importlib.metadata, importlib.util, json
versions = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "peft")}
print(json.dumps({"versions": versions, "plugin_found": importlib.util.find_spec("hf_geonorm") is not None}))
"""


def plugin_free_environment(variable: str, default: Path, create: str) -> tuple[PluginFreePython, dict[str, str]]:
    """The Python of the environment the variable ``variable`` names (else ``default``): one with torch, transformers
    and peft but no hf-geonorm, and the versions it holds. Without it the test skips, saying how to ``create`` it;
    where ``variable`` is set (.ci/run sets it) it fails instead."""
    given = os.environ.get(variable)
    venv = Path(given) if given else default
    python = venv / "bin" / "python"
    if not python.is_file():
        message = f"no environment at {venv}: create it with `{create}` (.ci/run does)"
        if given:
            pytest.fail(message)
        pytest.skip(message)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([str(python), "-c", ENVIRONMENT_PROBE], capture_output=True, text=True, env=env, cwd=venv,
                          stdin=subprocess.DEVNULL, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    probe = json.loads(done.stdout)
    assert not probe["plugin_found"], f"{venv} has hf_geonorm installed: it must hold torch, transformers and peft only"
    return PluginFreePython(python), probe["versions"]
