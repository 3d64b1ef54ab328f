"""What a run takes, said before it trains (memory: weights, gradients, AdamW's state, activations by tokens a step;
disk: final/ and each checkpoint), against the files it writes; and what a finished run keeps: final/ and its
metrics, its checkpoints (their optimizer state serves only --resume) removed unless --keep-checkpoints."""

from __future__ import annotations

import json
import re

import pytest
from transformers import AutoModelForCausalLM

from support.helpers import SHORT_RUN, contents, succeeds, train

SMALL = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "2", "--warmup-steps", "0", "--lr", "1e-3",
         "--eval-blocks", "8"]  # fmt: skip
HEADER_BYTES = 64_000  # a safetensors header, an optimizer file's pickled bookkeeping: at most this much besides


def shown(count: int) -> str:
    """Bytes as the log gives them."""
    if count >= 1e9:
        return f"{count / 1e9:.2f} GB"
    return f"{count / 1e6:.2f} MB" if count >= 1e6 else f"{count / 1e3:.0f} KB"


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory, data_file):
    """Two steps with a checkpoint at each, kept."""
    out = tmp_path_factory.mktemp("sizes") / "run"
    result = train("--data", data_file, *SMALL, "--max-steps", 2, "--eval-every", 1, "--keep-checkpoints",
                   "--output", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    return out, result.output


def test_a_run_says_what_it_will_take_and_writes_files_of_that_size(kept_run):
    """A 30-step SmolLM2 fine-tune peaked at 6.9 GB and left a 1.6 GB checkpoint beside a 517 MB model, unsaid."""
    out, output = kept_run
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    parameters = sum(p.numel() for p in model.parameters())  # a tied embedding and head counted once
    weights = parameters * 4  # float32
    estimated = json.loads((out / "metrics.json").read_text())["estimated_sizes"]
    assert (estimated["weights"], estimated["gradients"], estimated["optimizer"]) == (weights, weights, 2 * weights)
    assert estimated["final_model"] == weights and estimated["checkpoint"] == 3 * weights
    assert estimated["checkpoints"] == 2 and estimated["tokens"] == 2 * 32
    written = (out / "final" / "model.safetensors").stat().st_size
    assert weights < written < weights + HEADER_BYTES
    for step in (1, 2):
        checkpoint = out / f"checkpoint-{step}"
        assert weights < (checkpoint / "model.safetensors").stat().st_size < weights + HEADER_BYTES
        assert 2 * weights < (checkpoint / "optimizer.pt").stat().st_size < 2 * weights + HEADER_BYTES
    said = " ".join(output.split())
    memory = re.search(r"memory, estimated: about (\S+ \S+) a process: weights (\S+ \S+), gradients (\S+ \S+), "
                       r"AdamW's two moments (\S+ \S+), activations about (\S+ \S+) \(2 blocks of 32 tokens", said)
    assert memory, said
    assert memory.group(2) == memory.group(3) == shown(weights) and memory.group(4) == shown(2 * weights)
    assert f"disk, estimated: final/ {shown(weights)}; checkpoints {shown(3 * weights)} each" in said
    assert said.index("disk, estimated") < said.index("validation loss")  # before the first evaluation
    assert "checkpoint-2, checkpoint-1 kept beside final/ (--keep-checkpoints)" in said


def test_the_activations_are_estimated_by_the_tokens_of_a_step():
    from hf_geonorm.training.options import TrainOptions
    from hf_geonorm.training.run.optim import run_sizes

    from support.tiny_models import tiny_model

    model = tiny_model("llama")
    one = run_sizes(model, TrainOptions(batch_size=2, seq_len=32))
    assert run_sizes(model, TrainOptions(batch_size=4, seq_len=32)).activations == 2 * one.activations
    assert run_sizes(model, TrainOptions(batch_size=2, seq_len=96)).activations == 3 * one.activations
    assert run_sizes(model, TrainOptions(batch_size=2, seq_len=32, gradient_checkpointing=True)).activations < (
        one.activations
    )
    assert run_sizes(model, TrainOptions(batch_size=2, seq_len=32, gradient_accumulation_steps=8)) == one


def test_a_finished_run_keeps_its_final_model_and_not_its_checkpoints(tmp_path, data_file):
    out = tmp_path / "run"
    args = ["--data", data_file, *SMALL, "--max-steps", 2, "--eval-every", 1, "--output", out]
    result = train(*args)
    assert result.exit_code == 0, result.output
    assert not list(out.glob("checkpoint-*")) and (out / "final" / "model.safetensors").is_file()
    assert "removed checkpoint-2, checkpoint-1" in result.output and "--keep-checkpoints keeps them" in result.output
    before = contents(out)
    again = train(*args, "--resume")
    assert again.exit_code == 0, again.output
    said = " ".join(again.output.split())
    assert "already finished at step 2; nothing to do" in said and f"--model {out / 'final'}" in said
    assert contents(out) == before
    longer = train(*args[:-6], "--max-steps", 3, "--eval-every", 1, "--output", out, "--resume")
    assert longer.exit_code != 0 and "finished at step 2 and removed its checkpoints" in longer.output, longer.output
    assert contents(out) == before


def test_the_end_of_a_run_says_what_its_checkpoints_held_when_it_removes_them(short_run, tmp_path, data_file):
    out, output = short_run
    assert "removed checkpoint-4" in output and "--keep-checkpoints keeps them" in output
    assert not list(out.glob("checkpoint-*")) and (out / "final" / "model.safetensors").is_file()
    kept = tmp_path / "kept"
    output = succeeds("train", "--data", data_file, *SHORT_RUN, "--max-steps", 2, "--keep-checkpoints",
                      "--output", kept)  # fmt: skip
    assert "checkpoint-2 kept beside final/ (--keep-checkpoints)" in output and (kept / "checkpoint-2").is_dir()
