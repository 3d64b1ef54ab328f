"""`hf-geonorm train` and hf_geonorm.training: Trainer runs, checkpoints, resume, the bridge anneal, LoRA, the
loss curve, and DDP on CPU (gloo) against the single-process run. Killed runs and damaged inputs:
tests/training/test_train_faults.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_geonorm
from hf_geonorm.errors import EXTRAS
from hf_geonorm.training.data.corpus import resolve_corpus, stdlib_files
from hf_geonorm.training.run.bridge import MIN_COST, BridgeAnneal, anneal_weights, last_first_bridges
from hf_geonorm_cli.main import cli

from support.helpers import reference_blocks, reference_documents, stdlib_text, train
from support.tiny_models import tiny_model

SMALL = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--lr", "1e-3"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    return stdlib_text(tmp_path_factory, "json/decoder.py", "textwrap.py")


def eval_loss_of(folder: Path, data_file: Path, blocks: int) -> float:
    """The validation loss of a saved model, computed here from the saved tokenizer and weights (the validation
    documents held out as documented: tests/support/helpers.py), on the first ``blocks`` of them (as many as the
    run evaluated: metrics.json's ``evaluated_blocks``)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    val = torch.tensor(reference_blocks(tokenizer, reference_documents(data_file.read_text()), 32)[1][:blocks])
    with torch.no_grad():
        return model(val, labels=val).loss.item()


def test_train_writes_metrics_curve_checkpoints_and_a_reloadable_model(tmp_path, data_file):
    out = tmp_path / "run"
    result = train("--data", str(data_file), *SMALL, "--max-steps", "6", "--eval-every", "3", "--keep-checkpoints",
                   "--output", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 6 and metrics["model_type"] == "geonorm_gpt2"
    assert metrics["settings"]["norm_style"] == "geo"
    assert (out / "loss_curve.png").stat().st_size > 1000
    evals = [h["eval_loss"] for h in metrics["log_history"] if "eval_loss" in h]
    assert len(evals) >= 2 and all(math.isfinite(v) for v in evals)
    # the final folder reloads through the Auto classes and gives the reported validation loss
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    assert type(final).__name__ == "GeoNormGPT2ForCausalLM"
    evaluated = metrics["evaluated_blocks"]["validation"]
    assert eval_loss_of(out / "final", data_file, evaluated) == pytest.approx(metrics["final_eval_loss"], rel=1e-4)
    checkpoint = AutoModelForCausalLM.from_pretrained(out / "checkpoint-6")
    assert type(checkpoint) is type(final)
    for name, param in final.state_dict().items():
        assert torch.equal(param, checkpoint.state_dict()[name]), name
    assert json.loads((out / "checkpoint-6" / "config.json").read_text())["auto_map"]
    assert sorted(p.name for p in out.iterdir()) == [
        ".hf-geonorm-output.json", "checkpoint-3", "checkpoint-6", "final", "loss_curve.png", "metrics.json"
    ]  # fmt: skip


def test_the_train_extra_holds_matplotlib_and_what_train_checks_for_before_it_starts():
    """README's first command (`pip install -e ".[train]" && hf-geonorm train`) must give the loss curve, and a run
    without a package of the extra is refused before it starts (``errors.require_extra``, ``EXTRAS``)."""
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11's tomllib")
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    train_extra = {Requirement(text).name for text in project["optional-dependencies"]["train"]}
    assert "matplotlib" in train_extra and train_extra == set(EXTRAS["train"])
    assert not train_extra & {Requirement(text).name for text in project["dependencies"]}


def test_a_run_without_matplotlib_is_refused_before_it_starts_naming_the_extra(tmp_path, data_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails and find_spec finds none, as if not installed
    out = tmp_path / "run"
    result = train("--data", str(data_file), *SMALL, "--max-steps", "1", "--eval-every", "1", "--output", str(out))
    assert result.exit_code == 1 and not out.exists()
    assert result.output == ("Error: hf-geonorm train needs the train extra (matplotlib not installed): pip install "
                             "'hf-geonorm[train]'\n")  # fmt: skip


def test_a_loss_curve_that_cannot_be_written_is_reported(tmp_path, data_file, monkeypatch):
    from matplotlib.figure import Figure

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", no_space)
    out = tmp_path / "run"
    result = train("--data", str(data_file), *SMALL, "--max-steps", "1", "--eval-every", "1", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert "loss_curve.png was not written" in result.output
    assert not (out / "loss_curve.png").exists() and "loss curve in" not in result.output
    assert (out / "metrics.json").is_file() and (out / "final" / "model.safetensors").is_file()


def test_resume_from_a_checkpoint_gives_the_uninterrupted_result(tmp_path, data_file):
    import shutil

    out = tmp_path / "run"
    common = ["--data", str(data_file), *SMALL, "--eval-every", "2", "--keep-checkpoints", "--max-steps", "4",
              "--output", str(out)]  # fmt: skip
    assert common[-4:] == ["--max-steps", "4", "--output", str(out)]
    assert train(*common).exit_code == 0
    uninterrupted = json.loads((out / "metrics.json").read_text())["final_eval_loss"]
    # as if the run had been stopped after step 2
    for name in ("checkpoint-4", "final", "metrics.json", "loss_curve.png"):
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    result = train(*common, "--resume")
    assert result.exit_code == 0, result.output
    resumed = json.loads((out / "metrics.json").read_text())
    assert resumed["steps"] == 4
    assert resumed["final_eval_loss"] == pytest.approx(uninterrupted, rel=1e-5)
    # tokens/s counts the steps this run trained (2 of 4) over this run's time
    assert resumed["resumed_from_step"] == 2
    assert resumed["tokens_per_second"] * resumed["training_seconds"] == pytest.approx((4 - 2) * 4 * 32)
    # a checkpoint beyond --max-steps: nothing to train is an error, and nothing is touched
    before = {p.name: p.stat().st_mtime_ns for p in out.rglob("*")}
    past = train(*common[:-4], "--max-steps", "3", "--output", str(out), "--resume")
    assert past.exit_code != 0 and "step 4" in past.output and "--max-steps 3" in past.output, past.output
    assert {p.name: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_bridge_anneal_moves_a_converted_prenorm_checkpoint_to_geonorm(tmp_path, data_file):
    stock = tmp_path / "stock"
    tiny_model("gpt2", vocab_size=320).save_pretrained(stock)
    recipe = ["--bridge", "0", "--calibrate", str(data_file), "--calibrate-tokens", "64", "--first-token-prenorm"]
    convert = CliRunner().invoke(cli, ["convert", str(stock), str(tmp_path / "bridged"), *recipe])
    assert convert.exit_code == 0, convert.output
    out = tmp_path / "anneal"
    result = train(
        "--model", str(tmp_path / "bridged"), "--data", str(data_file), *SMALL, "--max-steps", "6",
        "--eval-every", "2", "--bridge-anneal", "4", "--output", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    history = json.loads((out / "metrics.json").read_text())["log_history"]
    bridges = [h["geo_bridge"] for h in history if "geo_bridge" in h]
    assert bridges == sorted(bridges) and bridges[0] < 1.0 and bridges[-1] == 1.0
    final = json.loads((out / "final" / "config.json").read_text())
    assert final["geo_bridge"] == 1.0 and final["geo_first_token_prenorm"] and final["geo_max_angle"] is None
    assert len(final["geo_alpha"]) == 2 * final["n_layer"]  # the calibrated step sizes, one per update
    anneal = BridgeAnneal(model=None, steps=4, start=0.2)
    assert [anneal.value_at(s) for s in (0, 2, 4, 9)] == pytest.approx([0.2, 0.6, 1.0, 1.0])
    # last-first: one update at a time from the last, each over its share of the steps
    out = tmp_path / "last-first"
    result = train(
        "--model", str(tmp_path / "bridged"), "--data", str(data_file), *SMALL, "--max-steps", "6",
        "--eval-every", "2", "--bridge-anneal", "4", "--bridge-order", "last-first", "--output", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    history = json.loads((out / "metrics.json").read_text())["log_history"]
    bridges = [h["geo_bridge"] for h in history if "geo_bridge" in h]  # the mean over the updates
    assert bridges[0] == 0.0  # the evaluation at step 0 runs the converted model as it is
    trained = [h["geo_bridge"] for h in history if "geo_bridge" in h and h["step"] > 0]
    assert trained == sorted(trained) and 0.0 < trained[0] < 1.0 and trained[-1] == 1.0
    assert json.loads((out / "final" / "config.json").read_text())["geo_bridge"] == 1.0


def test_last_first_anneal_converts_one_update_at_a_time_weighted_by_its_bridge_cost():
    # weights 1, 2, 1 of 4: the last update over progress 0-0.25, the middle one 0.25-0.75, the first 0.75-1
    expected = {0.0: [0, 0, 0], 0.125: [0, 0, 0.5], 0.5: [0, 0.5, 1], 0.875: [0.5, 1, 1], 1.0: [1, 1, 1]}
    for progress, values in expected.items():
        assert last_first_bridges(progress, [1.0, 2.0, 1.0]) == pytest.approx(values)
    # the weight of an update is the loss its conversion alone costs, at least MIN_COST
    assert anneal_weights([0.7, MIN_COST / 2, -0.01]) == pytest.approx([0.7, MIN_COST, MIN_COST])
    frames = [1.0, 0.5, 0.5, 0.25, 0.25, 0.25]
    model = hf_geonorm.convert(tiny_model("llama"), geo_bridge=0.0, geo_frames=frames,
                               geo_bridge_costs=[0.3, 0.0, 0.6, 0.001, -0.02, 0.1])  # fmt: skip
    anneal = BridgeAnneal(model, steps=10, start=0.0, order="last-first")
    assert anneal.weights == pytest.approx([0.3, MIN_COST, 0.6, MIN_COST, MIN_COST, 0.1])
    per_layer = hf_geonorm.convert(tiny_model("llama"), geo_bridge=0.0, geo_frames=frames, geo_bridge_costs=[1, 2, 3])
    assert BridgeAnneal(per_layer, steps=10, start=0.0, order="last-first").weights == [1, 1, 2, 2, 3, 3]
    assert anneal.value_at(0) == [0.0] * 6 and anneal.value_at(10) == 1.0
    uneven = [0.24, 0.54, 0.37, 0.6, 0.63, 0.07, 0.01]  # shares whose sum differs from the total by rounding
    assert last_first_bridges(1.0, uneven) == [1.0] * 7 and last_first_bridges(0.999, uneven)[0] < 1.0
    assert BridgeAnneal(model, steps=3, start=0.1).value_at(3) == 1.0
    assert anneal.value_at(5) == pytest.approx(last_first_bridges(0.5, anneal.weights))
    with pytest.raises(ValueError, match="together, last-first"):
        BridgeAnneal(model, steps=10, start=0.0, order="first-last")
    for missing in ({"geo_bridge_costs": [0.1] * 6}, {"geo_frames": frames}):
        with pytest.raises(ValueError, match="needs the Pre-Norm frames and bridge costs.*--calibrate"):
            BridgeAnneal(hf_geonorm.convert(tiny_model("llama"), geo_bridge=0.0, **missing), steps=10, start=0.0,
                         order="last-first")  # fmt: skip


def test_lora_and_gradient_checkpointing_train(tmp_path, data_file):
    out = tmp_path / "lora"
    options = ["--max-steps", "3", "--eval-every", "3", "--lora", "--gradient-checkpointing", "--decay", "sqrt"]
    result = train("--data", str(data_file), *SMALL, *options, "--output", str(out))
    assert result.exit_code == 0, result.output
    merged = AutoModelForCausalLM.from_pretrained(out / "final")
    assert type(merged).__name__ == "GeoNormGPT2ForCausalLM" and merged.config.geo_decay == "sqrt"
    assert not any("lora" in name for name in merged.state_dict())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--norm-style", "sideways"], "--norm-style"),
        (["--data", "no/such/file.txt"], "no/such/file.txt"),
        (["--arch", "bloom"], "supported"),
        (["--max-steps", "0"], "--max-steps"),
        (["--data", "typo.txt"], "typo.txt: no such file or folder"),
        (["--tokenizer", "/nonexistent"], "/nonexistent: no such folder"),
        (["--resume"], "no checkpoint"),
        (["--alpha", "-1"], "alpha"),
        (["--fsdp"], "--fsdp: accelerate shards with FSDP on GPUs only"),
    ],
)
def test_bad_input_is_one_line_and_nonzero_and_leaves_no_output(tmp_path, data_file, args, message):
    defaults = ["--data", str(data_file)] if "--data" not in args else []
    result = train(*defaults, *SMALL, "--max-steps", "2", "--output", str(tmp_path / "o"), *args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and "pip install datasets" not in result.output
    assert not (tmp_path / "o").exists()  # --fsdp fails after the Trainer has made the folder: removed again


def test_a_non_empty_output_is_refused_without_resume(tmp_path, data_file):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    result = train("--data", str(data_file), *SMALL, "--max-steps", "2", "--output", str(out))
    assert result.exit_code != 0 and "--resume" in result.output
    assert (out / "mine.txt").read_text() == "keep me"


def test_the_embedded_default_reads_the_standard_library():
    corpus = resolve_corpus(None)
    files = [path for path in stdlib_files() if path.stat().st_size > 0]
    assert "standard library" in corpus.label and files and all(path.suffix == ".py" for path in files)
    assert [(kind, Path(source)) for kind, source in corpus.shards] == [("file", path.absolute()) for path in files]
    # the first file's documents are that file, whole (pieces of whitespace alone are dropped)
    assert "".join(corpus.documents(0)).split() == files[0].read_text(encoding="utf-8").split()


def torchrun(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "hf_geonorm_cli.main", "train", *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


def launch_failure(done: subprocess.CompletedProcess) -> str:
    """What a failed launch said: every rank's error line (the root cause is easily cut off the tail), then the
    tail of its output."""
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    return "\n".join(errors[:20]) + "\n...\n" + done.stderr[-4000:]


def test_two_process_training_equals_one_process_with_the_same_global_batch(tmp_path, data_file):
    """DDP over two CPU processes (gloo). FSDP needs GPUs (accelerate runs DDP on CPU): --fsdp on CPU is refused
    (test_bad_input_is_one_line_and_nonzero_and_leaves_no_output)."""
    common = ["--data", str(data_file), "--seq-len", "32", "--vocab-size", "300", "--max-steps", "3",
              "--eval-every", "1", "--logging-steps", "1", "--warmup-steps", "0", "--lr", "1e-3"]  # fmt: skip
    single = train(*common, "--batch-size", "4", "--output", str(tmp_path / "single"))
    assert single.exit_code == 0, single.output
    done = torchrun([*common, "--batch-size", "2", "--keep-checkpoints", "--output", str(tmp_path / "multi")], tmp_path)
    assert done.returncode == 0, launch_failure(done)

    def losses(folder):
        history = json.loads((tmp_path / folder / "metrics.json").read_text())["log_history"]
        return [h["loss"] for h in history if "loss" in h] + [h["eval_loss"] for h in history if "eval_loss" in h]

    assert losses("multi") == pytest.approx(losses("single"), rel=1e-5)
    metrics = json.loads((tmp_path / "multi" / "metrics.json").read_text())
    assert metrics["tokens_per_second"] * metrics["training_seconds"] == pytest.approx(3 * 2 * 2 * 32)  # 2 processes
    reloaded = eval_loss_of(tmp_path / "multi" / "final", data_file, metrics["evaluated_blocks"]["validation"])
    assert reloaded == pytest.approx(metrics["final_eval_loss"], rel=1e-4)
    assert hf_geonorm.family_for(AutoModelForCausalLM.from_pretrained(tmp_path / "multi" / "final").config.model_type)
    assert sorted(p.name for p in (tmp_path / "multi").iterdir()) == [
        ".hf-geonorm-output.json", "checkpoint-2", "checkpoint-3", "final", "loss_curve.png", "metrics.json"
    ]  # fmt: skip


def test_train_leaves_the_process_group_it_ran_in_before_the_process_exits(tmp_path, monkeypatch):
    """A finished `train` under torchrun destroys its process group: left to the interpreter's exit, a rank could
    abort there (SIGABRT) after writing all its results (the two-process test above, on a loaded two-core machine:
    4 of 103 runs before this, none of 30 after). A one-process gloo group stands in for torchrun's here, and the run
    for one that finished."""
    import torch.distributed as dist

    from hf_geonorm.training.run import trainer as trainer_module

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        monkeypatch.setattr(trainer_module, "run_training", lambda options, log: {})
        result = train("--max-steps", "1")
        assert result.exit_code == 0, result.output
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_bf16_mixed_precision_trains(tmp_path, data_file):
    out = tmp_path / "bf16"
    result = train("--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "2", "--bf16",
                   "--output", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["options"]["precision"] == "bf16" and math.isfinite(metrics["final_eval_loss"])
