"""`hf-geonorm train` faults found in a hostile trial: resume strictness, a finished run resumed, non-finite
losses, bridge-cost overflow, the bridge schedule, stray weight files, and the wording of disk-full, dangling
--output and config.json errors. Killed runs (real signals): tests/test_train_faults.py."""

from __future__ import annotations

import errno
import json
import math
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hf_geonorm_cli.main import cli
from safetensors.torch import load_file, save_file
from tiny_models import tiny_model

from hf_geonorm.training import trainer
from hf_geonorm.training.bridge import anneal_weights, last_first_bridges
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.trainer import run_training

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--lr", "1e-3"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text((STDLIB / "textwrap.py").read_text())
    return path


def train(*args: object) -> object:
    return CliRunner().invoke(cli, ["train", *map(str, args)])


def error_lines(output: str) -> list[str]:
    """The ``Error: ...`` lines of the output (a progress bar may precede one on its line)."""
    return [line[line.index("Error:") :] for line in output.splitlines() if "Error:" in line]


def run_args(data_file: Path, out: Path) -> list[str]:
    return ["--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "2", "--output", str(out)]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data_file) -> Path:
    """A finished two-step run with one checkpoint (checkpoint-2); tests work on copies."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = train(*run_args(data_file, out))
    assert result.exit_code == 0, result.output
    return out


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resuming_a_finished_run_does_nothing_and_keeps_its_metrics(tmp_path, finished_run, data_file):
    out = shutil.copytree(finished_run, tmp_path / "run")
    before = snapshot(out)
    result = train(*run_args(data_file, out), "--resume")
    assert result.exit_code == 0, result.output
    assert "already finished at step 2; nothing to do" in result.output
    assert snapshot(out) == before  # metrics.json (its tokens/s), final/ and the plot as they were


def test_resume_refuses_a_checkpoint_missing_a_tensor_or_holding_an_unexpected_one(tmp_path, finished_run, data_file):
    out = shutil.copytree(finished_run, tmp_path / "run")
    shutil.rmtree(out / "final")  # as if killed while writing final/: --resume writes it from checkpoint-2
    (out / "metrics.json").unlink()
    weights = out / "checkpoint-2" / "model.safetensors"
    tensors = load_file(weights)
    missing = {k: v for k, v in tensors.items() if k != "transformer.h.0.attn.c_attn.weight"}
    save_file(missing, weights, metadata={"format": "pt"})
    before = snapshot(out)
    resumed = train(*run_args(data_file, out), "--resume")
    assert resumed.exit_code != 0, resumed.output
    assert f"{out / 'checkpoint-2'}" in resumed.output and "transformer.h.0.attn.c_attn.weight" in resumed.output
    assert "missing" in resumed.output and "Traceback" not in resumed.output
    assert snapshot(out) == before
    save_file({**tensors, "transformer.h.0.extra": torch.zeros(2)}, weights, metadata={"format": "pt"})
    extra = train(*run_args(data_file, out), "--resume")
    assert extra.exit_code != 0 and "unexpected" in extra.output and "transformer.h.0.extra" in extra.output


def test_resume_loads_every_tensor_of_a_checkpoint_saved_under_other_names(tmp_path, data_file):
    """transformers saves MoE experts one by one (not as the fused tensors the model holds): the resumed weights
    must still be the checkpoint's, not those of --model."""
    stock = tmp_path / "moe"
    tiny_model("deepseek_v3", vocab_size=320).save_pretrained(stock)
    out = tmp_path / "run"
    args = ["--model", stock, "--data", data_file, *SMALL, "--max-steps", "2", "--eval-every", "2", "--output", out]
    assert train(*args).exit_code == 0
    shutil.rmtree(out / "final")  # as if killed while writing final/: --resume writes it from checkpoint-2
    (out / "metrics.json").unlink()
    resumed = train(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    final, saved = load_file(out / "final" / "model.safetensors"), load_file(out / "checkpoint-2" / "model.safetensors")
    assert any(".experts.0." in key for key in saved) and final.keys() == saved.keys()
    assert [key for key in saved if not torch.equal(final[key], saved[key])] == []


def test_resume_refuses_lora_adapters_missing_a_tensor(tmp_path, data_file):
    out = tmp_path / "run"
    args = ["--data", data_file, *SMALL, "--eval-every", "1", "--lora", "--output", out]
    assert train(*args, "--max-steps", "1").exit_code == 0
    adapters = out / "checkpoint-1" / "adapter_model.safetensors"
    tensors = load_file(adapters)
    gone = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != gone}, adapters, metadata={"format": "pt"})
    resumed = train(*args, "--max-steps", "2", "--resume")
    assert resumed.exit_code != 0 and gone in resumed.output and "missing" in resumed.output, resumed.output
    assert not (out / "checkpoint-2").exists()


@pytest.mark.parametrize(
    "eval_every, what", [("1", "the validation loss at step 1"), ("5", "the training loss at step 2")]
)
def test_a_non_finite_loss_fails_the_run_naming_the_step(tmp_path, data_file, eval_every, what):
    # lr 1e30: the first update throws the weights to ~1e30, whose squares overflow float32 in the norms
    out = tmp_path / "run"
    args = ["--data", data_file, *SMALL, "--max-steps", "3", "--eval-every", eval_every, "--output", out]
    result = train(*args, "--lr", "1e30")
    assert result.exit_code != 0, result.output
    lines = error_lines(result.output)
    assert len(lines) == 1 and what in lines[0] and "nan" in lines[0].lower(), result.output
    assert "Traceback" not in result.output
    assert not out.exists()  # nothing published: the evaluation at step 1 comes before its checkpoint


def test_metrics_are_strict_json_with_null_for_non_finite_values():
    from hf_geonorm.training.outputs import strict_json

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    value = {"loss": [1.5, float("nan")], "grad_norm": float("inf"), "nested": {"x": -float("inf"), "n": 3}}
    parsed = json.loads(strict_json(value), parse_constant=refuse)
    assert parsed == {"loss": [1.5, None], "grad_norm": None, "nested": {"x": None, "n": 3}}


def test_huge_bridge_costs_give_the_shares_of_their_scaled_equivalent():
    huge = anneal_weights([1e308, 1e308, 1.0])
    scaled = [1.0, 1.0, 1e-308]  # the same proportions, divided by 1e308
    for progress in (0.0, 0.1, 0.25, 0.5, 0.6, 0.75, 0.99, 1.0):
        values = last_first_bridges(progress, huge)
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values)
        assert values == pytest.approx(last_first_bridges(progress, scaled), abs=1e-12)
    # written out: the last update's share is ~0 (done at once), then the middle over 0-0.5, the first over 0.5-1
    assert last_first_bridges(0.25, huge) == pytest.approx([0.0, 0.5, 1.0])
    assert last_first_bridges(0.75, huge) == pytest.approx([0.5, 1.0, 1.0])
    # each update's share of the anneal: the progress over which it moves, finite and together 1
    grid = [i / 1000 for i in range(1001)]
    moving = [[0.0 < last_first_bridges(p, huge)[j] < 1.0 for p in grid] for j in range(3)]
    shares = [sum(m) / 1000 for m in moving]
    assert shares == pytest.approx([0.5, 0.5, 0.0], abs=0.002) and sum(shares) == pytest.approx(1.0, abs=0.003)


def test_the_bridge_anneal_runs_the_written_schedule_and_ends_at_one(tmp_path, data_file, monkeypatch):
    seen: list[float] = []
    build = trainer.build_model

    def observed(options, tokenizer, **kwargs):  # every training forward records the bridge it runs with
        model = build(options, tokenizer, **kwargs)
        model.register_forward_pre_hook(lambda module, args: seen.append(module.config.geo_bridge) if module.training
                                        else None)  # fmt: skip
        return model

    monkeypatch.setattr(trainer, "build_model", observed)
    out = tmp_path / "run"
    options = TrainOptions(data=str(data_file), seq_len=32, vocab_size=300, batch_size=4, warmup_steps=0, lr=1e-3,
                           max_steps=5, eval_every=1, logging_steps=1, bridge_anneal=4, settings={"geo_bridge": 0.2},
                           output=str(out))  # fmt: skip
    metrics = run_training(options, log=lambda line: None)
    # step s (1-based) runs 0.2 + 0.8 * s / 4: 1.0 at the last anneal step, and after it
    schedule = [0.4, 0.6, 0.8, 1.0, 1.0]
    assert seen == pytest.approx(schedule)
    logged = {h["step"]: h["geo_bridge"] for h in metrics["log_history"] if "loss" in h}
    assert logged == pytest.approx({s: schedule[s - 1] for s in range(1, 6)})  # what the model ran at that step
    assert json.loads((out / "final" / "config.json").read_text())["geo_bridge"] == 1.0
    assert json.loads((out / "checkpoint-4" / "config.json").read_text())["geo_bridge"] == 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bridge-anneal", "5", "--max-steps", "4"], "--bridge-anneal 5 is longer than --max-steps 4"),
        (["--bridge-order", "last-first", "--max-steps", "4"], "--bridge-order last-first needs --bridge-anneal"),
    ],
)
def test_a_bridge_anneal_that_cannot_run_is_refused(tmp_path, data_file, args, message):
    result = train("--data", data_file, *SMALL, "--output", tmp_path / "o", *args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="longer than --max-steps"):
        TrainOptions(max_steps=4, bridge_anneal=5).validate()


@pytest.fixture(scope="module")
def init_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("init") / "cfg"
    result = CliRunner().invoke(cli, ["init", "gpt2", str(folder), "--preset", "tiny", "--vocab-size", "320"])
    assert result.exit_code == 0, result.output
    return folder


@pytest.mark.parametrize("name", ["weights.safetensors", "model-00001-of-00002.safetensors", "weights.bin"])
def test_a_config_folder_with_weights_under_another_name_is_refused(tmp_path, data_file, init_folder, name):
    folder = shutil.copytree(init_folder, tmp_path / "model")
    tiny_model("gpt2", vocab_size=320).save_pretrained(tmp_path / "saved")
    if name.endswith(".bin"):  # a pickle under a name transformers does not look for
        torch.save(load_file(tmp_path / "saved" / "model.safetensors"), folder / name)
    else:
        shutil.copy(tmp_path / "saved" / "model.safetensors", folder / name)
    out = tmp_path / "run"
    result = train("--model", folder, "--data", data_file, *SMALL, "--max-steps", "1", "--output", out)
    assert result.exit_code != 0, result.output
    assert name in result.output and "model.safetensors" in result.output and "index" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_invalid_settings_are_named_where_they_came_from(tmp_path, data_file, init_folder):
    folder = shutil.copytree(init_folder, tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "geo_alpha": -1.0}))
    stored = train("--model", folder, "--data", data_file, *SMALL, "--max-steps", "1", "--output", tmp_path / "a")
    assert stored.exit_code != 0, stored.output
    assert f"{folder / 'config.json'}: geo_alpha must be" in stored.output and "--alpha" not in stored.output
    given = train("--data", data_file, *SMALL, "--max-steps", "1", "--alpha", "1e9", "--output", tmp_path / "b")
    assert given.exit_code == 2 and "--alpha must be at most" in given.output, given.output


def test_an_output_that_is_a_dangling_symlink_is_named_and_left_alone(tmp_path, data_file):
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "gone" / "run")
    result = train("--data", data_file, *SMALL, "--max-steps", "1", "--output", link)
    assert result.exit_code != 0, result.output
    error = error_lines(result.output)
    assert len(error) == 1 and "dangling symbolic link" in error[0] and str(tmp_path / "gone" / "run") in error[0]
    assert link.is_symlink() and not (tmp_path / "gone").exists()


def _raise_enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", str(args[1]))


def _raise_torch_full(obj, path, *args, **kwargs):
    if str(path).endswith("optimizer.pt"):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 5120 vs 5016")
    return torch_save(obj, path, *args, **kwargs)


torch_save = torch.save


@pytest.mark.parametrize("writer", ["safetensors", "torch.save"])
def test_a_full_disk_during_a_checkpoint_is_named(tmp_path, data_file, monkeypatch, writer):
    import transformers.modeling_utils as modeling_utils

    if writer == "safetensors":
        monkeypatch.setattr(modeling_utils, "safe_save_file", _raise_enospc)
        named = "checkpoint-1/model.safetensors"
    else:
        monkeypatch.setattr(torch, "save", _raise_torch_full)
        named = "checkpoint-1"
    out = tmp_path / "run"
    result = train("--data", data_file, *SMALL, "--max-steps", "2", "--eval-every", "1", "--output", out)
    assert result.exit_code != 0, result.output
    error = error_lines(result.output)
    assert len(error) == 1 and f"no space left on device while writing {out / named}" in error[0], result.output
    assert ".partial-" not in error[0] and "Traceback" not in result.output
    assert not out.exists()
