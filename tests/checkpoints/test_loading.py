"""Checkpoints are read strictly (hf_geonorm.checkpoints.loading): a GeoNorm checkpoint holds the tensors its own
settings have (those new to it may be missing), a tensor missing from a sharded checkpoint names its index, the weight
files an index names lie in the model's folder, and a header that claims impossible sizes is refused, through the
library and the command line."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import hf_geonorm

from support.helpers import fails
from support.tiny_models import LAYERS, tiny_model, token_ids

# ---- a GeoNorm checkpoint must hold the tensors its own settings have ----


def saved_without_step_tensors(folder):
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    tensors = load_file(file)
    kept = {k: v for k, v in tensors.items() if not k.endswith(("step_scale", "step_bias"))}
    assert len(kept) == len(tensors) - 4 * LAYERS  # scale and bias of two updates per layer
    save_file(kept, file, metadata={"format": "pt"})


def test_learnable_step_tensors_missing_from_a_checkpoint_that_trained_them_are_refused(tmp_path):
    from hf_geonorm.checkpoints.loading import load_model, open_source

    model = hf_geonorm.convert(tiny_model("llama"), geo_learnable_step=True)
    model.save_pretrained(tmp_path / "geo")
    saved_without_step_tensors(tmp_path / "geo")
    with pytest.raises(ValueError, match=r"model\.safetensors: 12 tensor\(s\) missing \(model\.layers\.0\..*step_"):
        load_model(open_source(tmp_path / "geo"))
    line = fails("perplexity", tmp_path / "geo", "--text", __file__, "--max-tokens", "8")
    assert "12 tensor(s) missing" in line


def test_learnable_step_tensors_new_to_a_checkpoint_may_be_missing(tmp_path):
    """A stock checkpoint, or a GeoNorm one without learnable steps, converted to learnable steps: the step
    tensors start at scale 1, bias 0 (as a formula: the step of a model with no learnable step)."""
    from hf_geonorm.checkpoints.loading import load_model, open_source

    stock = tiny_model("llama", perturb=True)
    stock.save_pretrained(tmp_path / "stock")
    hf_geonorm.convert(stock, geo_alpha=0.3).save_pretrained(tmp_path / "geo")
    ids = token_ids()
    expected = hf_geonorm.convert(stock, geo_alpha=0.3)(input_ids=ids).logits
    for folder in ("stock", "geo"):
        source = open_source(tmp_path / folder)
        config = hf_geonorm.config_class_for("llama").from_pretrained(
            tmp_path / folder, norm_style="geo", geo_alpha=0.3, geo_learnable_step=True
        )
        model = load_model(source, config=config)
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=1e-6)


def test_a_tensor_missing_from_a_sharded_checkpoint_names_the_index(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    from hf_geonorm.checkpoints.loading import load_model, open_source

    tiny_model("llama").save_pretrained(tmp_path, max_shard_size="20KB")
    index_file = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    key = "model.layers.1.mlp.up_proj.weight"
    shard = tmp_path / index["weight_map"].pop(key)
    index_file.write_text(json.dumps(index))
    save_file({k: v for k, v in load_file(shard).items() if k != key}, shard, metadata={"format": "pt"})
    assert not (tmp_path / "model.safetensors").exists()
    with pytest.raises(ValueError, match=rf"^{index_file}: 1 tensor\(s\) missing \({key}\)"):
        load_model(open_source(tmp_path))


# ---- weight files read with the same checks everywhere ----


TEXT = Path(json.__file__).with_name("decoder.py")  # real text: a Python stdlib source file


def write_safetensors(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_info_refuses_a_header_that_claims_impossible_sizes(stock_llama, tmp_path):
    folder = tmp_path / "absurd"
    folder.mkdir()
    shutil.copy(stock_llama / "config.json", folder / "config.json")
    write_safetensors(folder / "model.safetensors",
                      {"lm_head.weight": {"dtype": "F32", "shape": [10**8, 10**8], "data_offsets": [0, 4]}},
                      b"\0" * 4)  # fmt: skip
    message = fails("info", folder)
    assert "lm_head.weight" in message and "4" in message and "damaged" in message
    assert "damaged" in fails("convert", folder, tmp_path / "out")


@pytest.mark.parametrize("how", ["parent", "absolute", "link"])
def test_weight_files_outside_the_folder_are_refused(stock_llama, tmp_path, how):
    other = tmp_path / "other"
    shutil.copytree(stock_llama, other)
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(stock_llama / "config.json", folder / "config.json")
    with safe_open(stock_llama / "model.safetensors", "pt") as f:
        keys = list(f.keys())
    shard = {"parent": "../other/model.safetensors", "absolute": str(other / "model.safetensors"),
             "link": "model-00001-of-00001.safetensors"}[how]  # fmt: skip
    if how == "link":
        (folder / shard).symlink_to(other / "model.safetensors")
    index = {"metadata": {}, "weight_map": {key: shard for key in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    for args in (("convert", folder, tmp_path / "out"), ("perplexity", folder, "--text", TEXT), ("info", folder)):
        message = fails(*args)
        assert "outside" in message and "weight files must lie in the model's folder" in message, (args, message)
    assert not (tmp_path / "out").exists()
