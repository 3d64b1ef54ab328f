"""`hf-geonorm info` on what a user may point it at: it reports the sizes loading would build (read through the
config class loading uses), refuses a config whose size keys belong to another model type, and says what a path
is when it is not a checkpoint folder (a file, a config.json that is not a regular file, pickle weights)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from transformers import LlamaConfig

from hf_geonorm.checkpoints.patching import config_class_for

from support.helpers import fails, invoke, succeeds


def tiny_gpt2(folder: Path) -> dict:
    """A config-only GeoNorm GPT-2 folder (``init --preset tiny``); its config."""
    result = invoke("init", "gpt2", folder, "--preset", "tiny")
    assert result.exit_code == 0, result.output
    return json.loads((folder / "config.json").read_text())


def info_json(path: Path) -> dict:
    result = invoke("info", path, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_config_whose_size_keys_belong_to_another_model_type_is_refused_naming_them(tmp_path, data_file):
    """A GPT-2 config relabelled geonorm_llama: info reported GPT-2's sizes, while loading builds LLaMA's."""
    folder = tmp_path / "relabelled"
    config = tiny_gpt2(folder)
    config["model_type"] = "geonorm_llama"
    (folder / "config.json").write_text(json.dumps(config))
    built = config_class_for("geonorm_llama").from_dict({k: v for k, v in config.items() if k != "model_type"})
    assert (built.num_hidden_layers, built.hidden_size) == (LlamaConfig().num_hidden_layers, LlamaConfig().hidden_size)
    assert (built.num_hidden_layers, built.hidden_size) != (config["n_layer"], config["n_embd"])  # what is at stake
    for args in (("info", folder), ("perplexity", folder, "--text", data_file)):
        message = fails(*args)
        assert f"{folder / 'config.json'}: model_type 'geonorm_llama' does not read n_embd, n_head, n_layer" in message
        assert "num_hidden_layers" in message and "fix model_type or those keys" in message, message


def test_info_reports_the_sizes_loading_builds_where_the_config_leaves_them_out(tmp_path):
    folder = tmp_path / "partial"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "vocab_size": 300}))
    data = info_json(folder)
    stock = LlamaConfig()  # the class transformers builds a llama config with, at its defaults
    assert (data["num_layers"], data["vocab_size"]) == (2, 300)
    assert (data["hidden_size"], data["positions"]) == (stock.hidden_size, stock.max_position_embeddings)
    output = invoke("info", folder).output
    assert f"2 layers, hidden size {stock.hidden_size}, vocabulary 300" in output, output


def test_info_on_a_file_that_is_not_a_gguf_says_it_is_a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a checkpoint")
    message = fails("info", path)
    assert f"{path} is a file, not a checkpoint folder" in message and ".gguf" in message, message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="the system has no FIFOs")
def test_info_refuses_a_config_json_that_is_not_a_regular_file_without_opening_it(tmp_path):
    folder = tmp_path / "fifo"
    folder.mkdir()
    fifo = folder / "config.json"
    os.mkfifo(fifo)

    def release_a_reader() -> None:  # should info open it after all: end its read, so that the test fails, not hangs
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader: nothing waits on it
            pass

    watchdog = threading.Timer(60, release_a_reader)
    watchdog.start()
    try:
        message = fails("info", folder)
    finally:
        watchdog.cancel()
    assert f"{fifo} is a FIFO (named pipe), not a regular file" in message, message


def test_info_names_pickle_weights_and_how_to_convert_them(tmp_path):
    folder = tmp_path / "pickled"
    tiny_gpt2(folder)
    (folder / "pytorch_model.bin").write_bytes(b"a pickle hf-geonorm must never load")
    output = invoke("info", folder).output
    line = next((line for line in output.splitlines() if line.startswith("weights:")), output)
    assert "pytorch_model.bin" in line and "pickle" in line and "never loads" in line, output
    assert "save_pretrained" in line and "model.safetensors" in line, output
    assert info_json(folder)["pickle_weights"] == ["pytorch_model.bin"]
    (folder / "config.json").unlink()
    message = fails("info", folder)
    assert "has no config.json" in message and "pytorch_model.bin" in message and "pickle" in message, message


# ---- the output folders of train and sweep ----


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, data_file) -> Path:
    """One step of `train` without --lr: the default model at its default rate."""
    from support.helpers import train_in

    root = tmp_path_factory.mktemp("runs")
    result = train_in(root, data_file, "--keep-checkpoints")
    assert result.exit_code == 0, result.output
    return root / "run"


def test_info_summarises_a_finished_run(run_folder):
    from hf_geonorm.training.rate_rule import RATE_RULE

    from support.helpers import ONE_STEP

    metrics = json.loads((run_folder / "metrics.json").read_text())
    cell = next(c for c in json.loads(RATE_RULE.read_text())["cells"]
                if (c["arch"], c["style"], c["layers"], c["width"]) == ("gpt2", "geo", 4, 128))  # fmt: skip
    per_step = int(ONE_STEP[ONE_STEP.index("--batch-size") + 1]) * int(ONE_STEP[ONE_STEP.index("--seq-len") + 1])
    data = info_json(run_folder)
    assert data["kind"] == "run" and data["finished"] and data["model"] == str(run_folder / "final")
    assert (data["steps"], data["max_steps"], data["tokens"]) == (1, 1, per_step)
    assert data["learning_rate"]["value"] == cell["lr"] and data["learning_rate"]["source"] == "measured cell"
    assert data["validation_loss"] == metrics["final_eval_loss"] and data["test_loss"] == metrics["final_test_loss"]
    result = invoke("info", run_folder)
    assert result.exit_code == 0, result.output
    lines = " ".join(result.output.split())
    assert f"model: {run_folder / 'final'}" in lines and f"hf-geonorm info {run_folder / 'final'}" in lines
    assert f"steps: 1 of 1, {per_step:,} tokens" in lines
    assert f"learning rate: {cell['lr']:g} (measured cell" in lines
    assert f"validation loss {metrics['final_eval_loss']:.4f}" in lines


def test_info_summarises_an_unfinished_run_from_its_newest_checkpoint(run_folder, tmp_path):
    import shutil

    folder = tmp_path / "stopped"
    shutil.copytree(run_folder, folder)
    for name in ("final", "metrics.json", "loss_curve.png"):  # as a run stopped after its checkpoint leaves it
        target = folder / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    state = json.loads((folder / "checkpoint-1" / "trainer_state.json").read_text())
    eval_loss = [entry["eval_loss"] for entry in state["log_history"] if "eval_loss" in entry][-1]
    data = info_json(folder)
    assert data["kind"] == "run" and not data["finished"] and data["model"] == str(folder / "checkpoint-1")
    assert (data["steps"], data["max_steps"], data["validation_loss"]) == (1, 1, eval_loss)
    assert data["learning_rate"]["source"] == "measured cell"
    output = " ".join(invoke("info", folder).output.split())
    assert "unfinished" in output and "--resume" in output and f"validation loss {eval_loss:.4f}" in output


def test_info_summarises_a_sweep_folder_from_its_journal(tmp_path):
    """A sweep's folder (the study's h_styles sweep, as it wrote it): its arms, each arm's chosen rate, the
    margin between the arms on test, and where its report is; the choice computed here from the journal's lines."""
    import shutil
    import statistics

    from support.helpers import welch_written_out

    source = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "sweeps" / "h_styles"
    folder = tmp_path / "sweep"
    folder.mkdir()
    for name in ("runs.jsonl", "sweep.md"):
        shutil.copy(source / name, folder / name)
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()[1:]]
    chosen, test_at_best = {}, {}
    for style in dict.fromkeys(run["style"] for run in runs):
        own = [run for run in runs if run["style"] == style]
        rates = sorted({run["lr"] for run in own})
        common = set.intersection(*({run["seed"] for run in own if run["lr"] == lr} for lr in rates))
        mean_val = {lr: statistics.fmean(run["val_loss"] for run in own if run["lr"] == lr and run["seed"] in common)
                    for lr in rates}  # fmt: skip
        chosen[style] = min(rates, key=lambda lr: (mean_val[lr], lr))
        test_at_best[style] = statistics.fmean(run["test_loss"] for run in own if run["lr"] == chosen[style])
    first, second = sorted(test_at_best, key=test_at_best.get)[:2]
    data = info_json(folder)
    assert data["kind"] == "sweep" and data["runs"] == len(runs) and data["report"] == str(folder / "sweep.md")
    assert {arm["arm"]: arm["best_rate"] for arm in data["arms"]} == chosen
    assert (data["choice"]["arm"], data["choice"]["runner_up"]) == (first, second)
    assert data["choice"]["margin"] == pytest.approx(test_at_best[second] - test_at_best[first])
    result = invoke("info", folder)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert f"report: {folder / 'sweep.md'}" in output and f"{first} is lowest on test" in output
    assert f"{first} is lowest on test, {test_at_best[second] - test_at_best[first]:.4f} below {second}" in output
    # what sweep.md carries, in short: the margin's standard error and Welch's p, the caveat of a fixed warm-up
    seeds = {style: [run["test_loss"] for run in runs if run["style"] == style and run["lr"] == chosen[style]]
             for style in (first, second)}  # fmt: skip
    _, error, _, p = welch_written_out(seeds[second], seeds[first])
    assert f"± {error:.4f}, Welch's p = {p:.3g}" in output
    assert "caveat: Not tuned: the warm-up." in output


def config_only(tmp_path: Path, name: str, **changes) -> Path:
    folder = tmp_path / name
    result = invoke("init", "gpt2", folder, "--preset", "tiny")
    assert result.exit_code == 0, result.output
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_info_on_a_very_deep_config_reads_it_quickly(tmp_path):
    folder = config_only(tmp_path, "deep", n_layer=100_000)
    started = time.monotonic()
    result = invoke("info", folder)
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 60
    assert "100000 layers" in result.output
    parameters = next(line for line in result.output.splitlines() if line.startswith("parameters:"))
    per_layer = 12 * 128 * 128 + 13 * 128  # GPT-2: attention and MLP weights and biases, two layer norms
    assert int(parameters.split()[1].replace(",", "")) > 100_000 * per_layer
    assert len(result.output) < 5_000  # the step sizes: the first and the last, not 100,000 of them


def test_info_on_a_run_folder_summarises_it_and_points_to_its_model(short_run):
    out = short_run[0]
    output = succeeds("info", out)
    assert f"hf-geonorm info {out / 'final'}" in output and "steps:" in output


def test_info_reads_a_gguf_file(tmp_path):
    pytest.importorskip("gguf")
    from support.tiny_gguf import write_tiny_gguf

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    output = succeeds("info", path)
    assert "(GGUF)" in output and "llama" in output and "positions:    64" in output
    assert "license apache-2.0" in output and "parameters:" in output
