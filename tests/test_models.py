"""GeoNorm families through the ordinary transformers API (issue: patcher registry and Auto classes)."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
import torch
from tiny_models import VOCAB, install_reference, tiny_config, tiny_model, token_ids
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, Trainer, TrainingArguments

import hf_geonorm

OWN_TYPES = sorted({
    "arcee", "bitnet", "cwm", "deepseek_v2", "deepseek_v3", "diffllama", "dots1", "ernie4_5", "glm", "glm4_moe",
    "helium", "hunyuan_v1_dense", "hunyuan_v1_moe", "llama", "ministral", "mistral", "mixtral", "olmo", "qwen2",
    "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "smollm3", "starcoder2", "gemma", "phi3", "granite", "gpt2",
})  # fmt: skip
CORE_TYPES = ["llama", "mistral", "qwen2", "qwen3", "olmo", "gemma", "phi3", "granite", "mixtral", "qwen3_moe", "gpt2"]


def logits(model, ids=None):
    with torch.no_grad():
        return model(ids if ids is not None else token_ids()).logits


def layers_of(model):
    return model.transformer.h if model.config.model_type.removeprefix("geonorm_") == "gpt2" else model.model.layers


@pytest.mark.parametrize("model_type", OWN_TYPES)
def test_pre_and_bridge_zero_equal_the_stock_model(model_type):
    stock = tiny_model(model_type)
    reference = logits(stock)
    pre = hf_geonorm.convert(stock, norm_style="pre")
    assert type(pre).__name__.startswith("GeoNorm") and pre.config.model_type == f"geonorm_{model_type}"
    assert (logits(pre) - reference).abs().max() <= 1e-6
    bridge0 = hf_geonorm.convert(stock, norm_style="geo", geo_bridge=0.0)
    assert (logits(bridge0) - reference).abs().max() <= 1e-5
    # the stock model is left untouched
    assert type(stock).__name__ == hf_geonorm.family_for(model_type).stock_causal_class.__name__
    assert torch.equal(logits(stock), reference)


SETTINGS_GRID = [
    {},
    {"geo_max_angle": None},
    {"geo_alpha": 4.0},
    {"geo_alpha": 0.1},
    {"geo_decay": "sqrt"},
    {"geo_decay": "linear"},
    {"geo_decay": "constant"},
    {"geo_radius": "sqrt_d"},
    {"geo_radius": "sqrt_d", "geo_alpha": 8.0, "geo_max_angle": None},
]


def reference_logits(stock, settings):
    ref = install_reference(
        copy.deepcopy(stock),
        decay=settings.get("geo_decay", "harmonic"),
        alpha=settings.get("geo_alpha", 0.25),  # the documented default (README, Settings)
        max_angle=settings.get("geo_max_angle", math.pi / 4),
        radius=settings.get("geo_radius", "embedding"),
    )
    return logits(ref)


def settings_id(settings):
    return ",".join(f"{k}={v}" for k, v in settings.items()) or "default"


@pytest.mark.parametrize("settings", SETTINGS_GRID, ids=settings_id)
@pytest.mark.parametrize("model_type", ["llama", "gemma", "granite", "gpt2"])
def test_geo_equals_the_written_out_block(model_type, settings):
    stock = tiny_model(model_type)
    geo = hf_geonorm.convert(stock, norm_style="geo", **settings)
    torch.testing.assert_close(logits(geo), reference_logits(stock, settings), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", CORE_TYPES)
def test_geo_default_equals_the_written_out_block(model_type):
    stock = tiny_model(model_type)
    geo = hf_geonorm.convert(stock)
    torch.testing.assert_close(logits(geo), reference_logits(stock, {}), atol=2e-5, rtol=1e-4)


def block_outputs(model, ids):
    """Every decoder layer's input and output (hooks; the last hidden state reported by HF is after the final
    norm)."""
    seen = []
    hooks = [
        layer.register_forward_hook(lambda m, args, out: seen.append(out[0] if isinstance(out, tuple) else out))
        for layer in layers_of(model)
    ]
    with torch.no_grad():
        first = model(ids, output_hidden_states=True).hidden_states[0]
    for h in hooks:
        h.remove()
    return first, seen


@pytest.mark.parametrize("model_type", CORE_TYPES)
def test_geo_keeps_every_token_on_its_sphere(model_type):
    ids = token_ids()
    geo = hf_geonorm.convert(tiny_model(model_type))
    entry, outputs = block_outputs(geo, ids)
    for out in outputs:
        torch.testing.assert_close(out.norm(dim=-1), entry.norm(dim=-1), rtol=1e-5, atol=1e-6)
    geo = hf_geonorm.convert(tiny_model(model_type), geo_radius="sqrt_d")
    _, outputs = block_outputs(geo, ids)
    for out in outputs:
        torch.testing.assert_close(out.norm(dim=-1), torch.full(out.shape[:-1], math.sqrt(32.0)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", OWN_TYPES)
def test_save_and_reload_through_auto_classes(model_type, tmp_path):
    model = hf_geonorm.convert(tiny_model(model_type), geo_alpha=0.75, geo_decay="sqrt")
    model.save_pretrained(tmp_path)
    files = sorted(os.listdir(tmp_path))
    assert "model.safetensors" in files and not [f for f in files if f.endswith((".bin", ".pt", ".pth"))]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == f"geonorm_{model_type}"
    assert config["norm_style"] == "geo" and config["geo_alpha"] == 0.75 and config["geo_decay"] == "sqrt"
    assert config["geo_max_angle"] == pytest.approx(math.pi / 4)
    reloaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(reloaded) is type(model)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(logits(reloaded), logits(model))
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base).__name__ == type(model).__name__.replace("ForCausalLM", "Model")


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_documented_path_from_a_stock_checkpoint(model_type, tmp_path):
    stock = tiny_model(model_type)
    stock.save_pretrained(tmp_path)
    config_class = hf_geonorm.config_class_for(model_type)
    config = config_class.from_pretrained(tmp_path, norm_style="geo", geo_alpha=2.0)
    assert config.model_type == f"geonorm_{model_type}" and config.geo_alpha == 2.0
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, config=config, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(logits(model), logits(hf_geonorm.convert(stock, geo_alpha=2.0)))
    with pytest.raises(ValueError, match="norm_style"):
        config_class.from_pretrained(tmp_path, norm_style="sideways")


def test_a_checkpoint_of_another_family_is_refused(tmp_path):
    tiny_model("gpt2").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'gpt2'"):
        hf_geonorm.GeoNormLlamaConfig.from_pretrained(tmp_path)


def test_unsupported_architecture_names_the_supported_ones():
    from transformers import BloomConfig, BloomForCausalLM

    model = BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4))
    with pytest.raises(ValueError, match="supported: .*llama"):
        hf_geonorm.apply_geonorm(model)
    assert "llama" in hf_geonorm.supported_architectures() and "gpt2" in hf_geonorm.supported_architectures()


def test_config_settings_are_validated_on_construction_and_assignment():
    with pytest.raises(ValueError, match="geo_decay"):
        hf_geonorm.GeoNormLlamaConfig(geo_decay="cubic")
    with pytest.raises(ValueError, match="geo_bridge"):
        hf_geonorm.GeoNormLlamaConfig(geo_bridge=2.0)
    config = hf_geonorm.GeoNormLlamaConfig(num_hidden_layers=3)
    with pytest.raises(ValueError, match="one value per layer"):
        config.geo_alpha = [1.0, 0.5]
    config.geo_alpha = [1.0, 0.5, 0.25]
    with pytest.raises(ValueError, match="pre, post, sandwich, deepnorm, geo"):
        config.norm_style = "mid"
    assert AutoConfig.for_model("geonorm_llama").__class__ is hf_geonorm.GeoNormLlamaConfig


def test_per_layer_alpha_list_is_used_as_the_step_sizes():
    stock = tiny_model("llama")
    geo = hf_geonorm.convert(stock, geo_alpha=[0.3, 0.2, 0.1], geo_decay="constant")
    steps = [layer.geonorm_attn_residual.step_size for layer in geo.model.layers]
    assert steps == [0.3, 0.2, 0.1]


@pytest.mark.parametrize("model_type", OWN_TYPES)
def test_greedy_generation_is_the_same_with_and_without_the_cache(model_type):
    model = hf_geonorm.convert(tiny_model(model_type))
    prompt = token_ids(batch=1, length=5)
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    with_cache = model.generate(prompt, use_cache=True, **kwargs)
    without = model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(with_cache, without) and with_cache.shape[1] == 13


@pytest.mark.parametrize("model_type", OWN_TYPES)
def test_eager_and_sdpa_attention_agree(model_type, tmp_path):
    hf_geonorm.convert(tiny_model(model_type)).save_pretrained(tmp_path)
    eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    sdpa = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
    torch.testing.assert_close(logits(eager), logits(sdpa), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", OWN_TYPES)
def test_gradient_checkpointing_recomputes_and_keeps_gradients(model_type):
    ids = token_ids()

    def grads_and_calls(checkpointing):
        model = hf_geonorm.convert(tiny_model(model_type)).train()
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": False})
        calls = []
        layers_of(model)[0].mlp.register_forward_hook(lambda *a: calls.append(1))
        model(ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, len(calls)

    plain, plain_calls = grads_and_calls(False)
    recomputed, recomputed_calls = grads_and_calls(True)
    assert plain_calls == 1 and recomputed_calls == 2
    assert plain.keys() == recomputed.keys()
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("model_type", OWN_TYPES)
def test_lora_train_save_reload_merge(model_type, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    base_dir = tmp_path / "base"
    hf_geonorm.convert(tiny_model(model_type)).save_pretrained(base_dir)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base_dir),
        LoraConfig(r=4, lora_alpha=8, fan_in_fan_out=model_type == "gpt2", init_lora_weights=False),
    )  # no target_modules: PEFT knows the geonorm_ model types
    assert model.get_nb_trainable_parameters()[0] > 0
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = token_ids()
    for _ in range(3):
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    trained = logits(model)
    model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "adapter")
    torch.testing.assert_close(logits(reloaded.eval()), trained, atol=1e-5, rtol=1e-5)
    merged = reloaded.merge_and_unload()
    assert type(merged).__name__.startswith("GeoNorm")
    torch.testing.assert_close(logits(merged), trained, atol=1e-5, rtol=1e-5)


def test_apply_geonorm_patches_in_place_and_through_peft():
    from peft import LoraConfig, get_peft_model

    stock = tiny_model("llama")
    reference = logits(hf_geonorm.convert(stock, geo_decay="linear"))
    peft_model = get_peft_model(copy.deepcopy(stock), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert hf_geonorm.apply_geonorm(peft_model, geo_decay="linear") is peft_model
    inner = peft_model.get_base_model()
    assert type(inner).__name__ == "GeoNormLlamaForCausalLM" and inner.config.geo_decay == "linear"
    torch.testing.assert_close(logits(peft_model.eval()), reference)  # LoRA B starts at zero


def test_trainer_runs_a_few_steps(tmp_path):
    from torch.utils.data import Dataset

    class Repeated(Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            ids = token_ids(batch=1, length=16, seed=i)[0]
            return {"input_ids": ids, "labels": ids}

    model = hf_geonorm.convert(tiny_model("gpt2"))
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-3,
        report_to=[], save_strategy="no", use_cpu=True, logging_steps=1,
    )  # fmt: skip
    result = Trainer(model=model, args=args, train_dataset=Repeated()).train()
    assert result.global_step == 4 and math.isfinite(result.training_loss)


def test_learnable_step_and_sandwich_add_only_their_parameters(tmp_path):
    stock = tiny_model("llama")
    stock_names = {n for n, _ in stock.named_parameters()}
    learnable = hf_geonorm.convert(stock, geo_learnable_step=True)
    added = {n for n, _ in learnable.named_parameters()} - stock_names
    assert len(added) == 2 * 2 * 3 and all(n.endswith(("step_scale", "step_bias")) for n in added)
    sandwich = hf_geonorm.convert(stock, norm_style="sandwich")
    added = {n for n, _ in sandwich.named_parameters()} - stock_names
    assert len(added) == 2 * 3 and all(".output_norm." in n for n in added)
    # loading a stock checkpoint initialises what is missing to the identity
    stock.save_pretrained(tmp_path)
    config = hf_geonorm.GeoNormLlamaConfig.from_pretrained(tmp_path, geo_learnable_step=True)
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, config=config, output_loading_info=True)
    assert set(info["missing_keys"]) == {n for n, _ in learnable.named_parameters()} - stock_names
    for layer in loaded.model.layers:
        assert layer.geonorm_mlp_residual.step_scale.item() == 1.0
        assert layer.geonorm_mlp_residual.step_bias.item() == 0.0
    torch.testing.assert_close(logits(loaded), logits(hf_geonorm.convert(stock)))


def test_deepnorm_from_scratch_scales_value_output_and_ffn_weights():
    config = tiny_config("llama")
    torch.manual_seed(3)
    stock = AutoModelForCausalLM.from_config(config)
    torch.manual_seed(3)
    deep = hf_geonorm.GeoNormLlamaForCausalLM(hf_geonorm.GeoNormLlamaConfig(**config.to_dict(), norm_style="deepnorm"))
    beta = (8 * 3) ** -0.25
    s, d = stock.model.layers[1], deep.model.layers[1]
    for name in ("self_attn.v_proj", "self_attn.o_proj", "mlp.down_proj", "mlp.up_proj"):
        torch.testing.assert_close(d.get_submodule(name).weight, beta * s.get_submodule(name).weight)
    torch.testing.assert_close(d.self_attn.q_proj.weight, s.self_attn.q_proj.weight)
    # converting trained weights leaves them as they are
    converted = hf_geonorm.convert(stock, norm_style="deepnorm")
    assert torch.equal(converted.model.layers[1].self_attn.v_proj.weight, s.self_attn.v_proj.weight)


def test_torch_compile_matches_eager():
    model = hf_geonorm.convert(tiny_model("llama")).train()
    ids = token_ids()
    eager_loss = model(ids, labels=ids).loss
    eager_loss.backward()
    eager_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(model)
    loss = compiled(ids, labels=ids).loss
    loss.backward()
    torch.testing.assert_close(loss, eager_loss, atol=1e-5, rtol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, eager_grads[name], atol=1e-5, rtol=1e-4)
