"""Every registered case (tests/support/tiny_models.py) through the ordinary transformers API, against the stock model
and the written-out reference (tests/support/reference.py).

For each case: ``norm_style='pre'`` and ``'geo'`` with ``geo_bridge=0`` give the stock logits; ``'geo'`` equals
the reference (the documented defaults, and steps so large that the clamps act) and keeps every token on its
sphere; save_pretrained -> the Auto classes give the same class and logits; greedy generation is the same with
and without the cache; gradient checkpointing recomputes and keeps the gradients; LoRA finds its default
targets. For the ``CLASSIC`` cases also: eager and SDPA attention agree; LoRA trains, saves, reloads and merges.
Then the API around the families.
"""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, Trainer, TrainingArguments
from transformers.pytorch_utils import Conv1D

import hf_geonorm
from hf_geonorm.modeling.decoder_layers import DECODER_LAYERS
from hf_geonorm.modeling.transformers_versions import INSTALLED

from support.reference import PI4, geodesic_step, geonorm_logits, plain_logits, reference_logits
from support.tiny_models import CASES, CLASSIC, VOCAB, layer_outputs, layers_of, stock_model, tiny_model, token_ids

IDS = list(CASES)


def logits(model, ids=None):
    with torch.no_grad():
        return model(ids if ids is not None else token_ids()).logits


def test_the_registry_covers_every_supported_architecture():
    assert {case.model_type for case in CASES.values()} == set(hf_geonorm.supported_architectures())


@pytest.mark.parametrize("case", IDS)
def test_pre_and_bridge_zero_equal_the_stock_model(case):
    model_type = CASES[case].model_type
    stock = stock_model(case)
    reference = logits(stock)
    pre = hf_geonorm.convert(stock, norm_style="pre")
    assert type(pre) is hf_geonorm.family_for(model_type).causal_class
    assert type(pre).__name__.startswith("GeoNorm") and pre.config.model_type == f"geonorm_{model_type}"
    layout = hf_geonorm.family_for(model_type).layout.for_config(pre.config)
    assert {type(layer) for layer in layers_of(pre)} == {DECODER_LAYERS[layout.block]}  # declared: test_layouts.py
    assert (logits(pre) - reference).abs().max() <= 1e-6
    bridge0 = hf_geonorm.convert(stock, norm_style="geo", geo_bridge=0.0)
    assert (logits(bridge0) - reference).abs().max() <= 1e-5
    assert (logits(hf_geonorm.convert(stock, norm_style="geo")) - reference).abs().max() > 1e-4  # geo differs
    # the stock model is left untouched
    assert type(stock) is hf_geonorm.family_for(model_type).stock_causal_class
    assert torch.equal(logits(stock), reference)


@pytest.mark.parametrize("case", IDS)
def test_geo_equals_the_written_out_block(case):
    stock, block, ids = stock_model(case), CASES[case].block, token_ids()
    # the written-out block with plain addition is the stock model (checks the copy of the stock block)
    assert (plain_logits(stock, block, ids) - logits(stock, ids)).abs().max() <= 1e-6
    for settings in ({}, {"geo_alpha": 40.0, "geo_decay": "constant"}):  # defaults; steps so large the clamps act
        clamped: list[int] = []
        expected = geonorm_logits(stock, block, ids, clamped=clamped, **settings)
        got = logits(hf_geonorm.convert(stock, norm_style="geo", **settings), ids)
        assert (got - expected).abs().max() <= 3e-6 * max(1.0, expected.abs().max().item())
        if settings:
            assert sum(clamped) > 0, "the clamp never acted: the test would not check it"


SETTINGS_GRID = [  # the defaults are checked for every case, above
    {"geo_max_angle": None},
    {"geo_alpha": 4.0},
    {"geo_alpha": 0.1},
    {"geo_decay": "sqrt"},
    {"geo_decay": "linear"},
    {"geo_decay": "constant"},
    {"geo_radius": "sqrt_d"},
    {"geo_radius": "sqrt_d", "geo_alpha": 8.0, "geo_max_angle": None},
]


def settings_id(settings):
    return ",".join(f"{k}={v}" for k, v in settings.items())


@pytest.mark.parametrize("settings", SETTINGS_GRID, ids=settings_id)
@pytest.mark.parametrize("case", ["llama", "gemma", "granite", "gpt2"])
def test_every_setting_equals_the_written_out_block(case, settings):
    stock, ids = stock_model(case), token_ids()
    geo = hf_geonorm.convert(stock, norm_style="geo", **settings)
    expected = geonorm_logits(stock, CASES[case].block, ids, **settings)
    torch.testing.assert_close(logits(geo, ids), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", IDS)
def test_geo_keeps_every_token_on_its_sphere(case):
    stock = stock_model(case)
    d = stock.config.hidden_size
    for radius in ("embedding", "sqrt_d"):
        entry, outputs = layer_outputs(hf_geonorm.convert(stock, norm_style="geo", geo_radius=radius), token_ids())
        assert len(outputs) == len(layers_of(stock))
        expected = entry.norm(dim=-1) if radius == "embedding" else torch.full(entry.shape[:-1], math.sqrt(d))
        for out in outputs:
            torch.testing.assert_close(out.norm(dim=-1), expected, rtol=1e-5, atol=0)
    # not vacuous: the stock model does change the norms
    with torch.no_grad():
        stock_states = stock(token_ids(), output_hidden_states=True).hidden_states
    before, after = stock_states[0].norm(dim=-1), stock_states[1].norm(dim=-1)
    assert ((after - before).abs() / before).max() > 1e-3


@pytest.mark.parametrize("case", IDS)
def test_pre_reports_the_stock_hidden_states(case):
    """``output_hidden_states`` finds the GeoNorm decoder layers (transformers looks them up by class): ``pre``
    reports the stock model's hidden states, the embeddings and one per layer. The stock model is a fresh one:
    the capture hooks of one that reported its hidden states before would be copied along by ``convert``."""
    stock, ids = tiny_model(case, perturb=True), token_ids()
    pre = hf_geonorm.convert(stock, norm_style="pre")
    with torch.no_grad():
        got = pre(ids, output_hidden_states=True).hidden_states
        expected = stock(ids, output_hidden_states=True).hidden_states
    assert len(got) == len(expected) == len(layers_of(stock)) + 1
    for ours, theirs in zip(got, expected, strict=True):
        assert (ours - theirs).abs().max() <= 1e-6


@pytest.mark.parametrize("case", ["llama", "gpt2", "falcon"])
def test_models_built_as_geonorm_report_every_layers_hidden_state(case):
    """A base model built as the GeoNorm class, and a causal LM whose base is patched while it is built: each
    reports the embeddings and every decoder layer's output (the last after the final norm)."""
    family = hf_geonorm.family_for(CASES[case].model_type)
    config = family.config_class(**CASES[case].config)
    for model in (family.base_class(config).eval(), family.causal_class(config).eval()):
        entry, outputs = layer_outputs(model, token_ids())
        with torch.no_grad():
            states = model(token_ids(), output_hidden_states=True).hidden_states
        assert len(states) == len(outputs) + 1 and torch.equal(states[0], entry)
        for state, output in zip(states[1:-1], outputs[:-1], strict=True):
            assert torch.equal(state, output)


@pytest.mark.parametrize("case", ["llama", "gpt2", "falcon"])
def test_device_maps_keep_each_geonorm_layer_whole(case, tmp_path):
    """transformers and accelerate keep a module on one device when its class *name* is in the model's
    ``_no_split_modules``: the GeoNorm decoder layer's name is there however the model was made."""
    stock = stock_model(case)
    converted = hf_geonorm.convert(stock)
    converted.save_pretrained(tmp_path)
    family = hf_geonorm.family_for(CASES[case].model_type)
    built = family.causal_class(family.config_class(**CASES[case].config))
    for model in (converted, built, family.base_class(built.config), AutoModelForCausalLM.from_pretrained(tmp_path)):
        names = {type(layer).__name__ for layer in layers_of(model)}
        assert names and names <= set(model._no_split_modules), (type(model).__name__, model._no_split_modules)


@pytest.mark.parametrize("case", IDS)
def test_save_and_reload_through_the_auto_classes(case, tmp_path):
    model_type = CASES[case].model_type
    model = hf_geonorm.convert(stock_model(case), geo_alpha=0.75, geo_decay="sqrt")
    model.save_pretrained(tmp_path)
    files = sorted(os.listdir(tmp_path))
    assert "model.safetensors" in files and not [f for f in files if f.endswith((".bin", ".pt", ".pth"))]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == f"geonorm_{model_type}"
    assert config["norm_style"] == "geo" and config["geo_alpha"] == 0.75 and config["geo_decay"] == "sqrt"
    assert config["geo_max_angle"] == pytest.approx(PI4)
    reloaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(reloaded) is type(model)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(logits(reloaded.eval()), logits(model))
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base).__name__ == type(model).__name__.replace("ForCausalLM", "Model")


@pytest.mark.parametrize("case", IDS)
def test_generation_with_and_without_the_cache(case):
    """The layers pass the cache through: greedy decoding of 'pre' is the stock model's, and 'geo' decodes the
    same with and without the cache."""
    stock = stock_model(case)
    prompt = token_ids(batch=1, length=5)
    greedy = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = stock.generate(prompt, **greedy)
        assert torch.equal(hf_geonorm.convert(stock, norm_style="pre").generate(prompt, **greedy), expected)
        geo = hf_geonorm.convert(stock, norm_style="geo")
        scored = dict(output_scores=True, return_dict_in_generate=True, **greedy)
        cached = geo.generate(prompt, use_cache=True, **scored)
        plain = geo.generate(prompt, use_cache=False, **scored)
    assert torch.equal(cached.sequences, plain.sequences) and cached.sequences.shape[1] == 10
    for a, b in zip(cached.scores, plain.scores, strict=True):  # -inf where min_new_tokens bars EOS
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", CLASSIC)
def test_eager_and_sdpa_attention_agree(case, tmp_path):
    hf_geonorm.convert(stock_model(case)).save_pretrained(tmp_path)
    eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    sdpa = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
    torch.testing.assert_close(logits(eager), logits(sdpa), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", IDS)
def test_gradient_checkpointing_recomputes_and_keeps_gradients(case):
    ids = token_ids()

    def grads_and_calls(checkpointing):
        model = hf_geonorm.convert(stock_model(case)).train()
        if checkpointing:  # named so from transformers 5.23 on, gradient checkpointing before
            enable = "activation_checkpointing_enable" if INSTALLED >= (5, 23) else "gradient_checkpointing_enable"
            getattr(model, enable)({"use_reentrant": False})
        calls = []
        layers_of(model)[0].mlp.register_forward_hook(lambda *a: calls.append(1))
        torch.manual_seed(0)  # the same dropout masks (Falcon, Phi...) in both runs
        model(ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, len(calls)

    plain, plain_calls = grads_and_calls(False)
    recomputed, recomputed_calls = grads_and_calls(True)
    assert plain_calls == 1 and recomputed_calls == 2
    assert plain.keys() == recomputed.keys()
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", IDS)
def test_lora_finds_its_default_targets(case):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(hf_geonorm.convert(stock_model(case)), LoraConfig(r=2))  # no target_modules
    assert model.get_nb_trainable_parameters()[0] > 0
    ids = token_ids()
    model(ids, labels=ids).loss.backward()
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_grads and all(g is not None for g in lora_grads)


@pytest.mark.parametrize("case", CLASSIC)
def test_lora_train_save_reload_merge(case, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    base_dir = tmp_path / "base"
    stock = stock_model(case)
    hf_geonorm.convert(stock).save_pretrained(base_dir)
    conv1d = any(isinstance(module, Conv1D) for module in stock.modules())  # weights stored transposed
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base_dir),
        LoraConfig(r=4, lora_alpha=8, fan_in_fan_out=conv1d, init_lora_weights=False),
    )  # no target_modules: PEFT knows the geonorm_ model types
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


# ---- the API around the families ----


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
    stock, ids, steps = stock_model("llama"), token_ids(), [0.3, 0.2, 0.1]
    geo = hf_geonorm.convert(stock, geo_alpha=steps, geo_decay="constant")
    expected = reference_logits(stock, "llama", ids, lambda k: lambda x, u: geodesic_step(x, u, steps[k], PI4))
    torch.testing.assert_close(logits(geo, ids), expected, atol=1e-6, rtol=1e-5)


def test_alpha_list_with_one_value_per_update_steps_attention_and_feed_forward_apart():
    stock, ids = stock_model("llama"), token_ids()
    num_layers = len(layers_of(stock))
    steps = [0.3 / (i + 1) + 0.05 * (i % 2) for i in range(2 * num_layers)]  # attention, feed-forward, ...
    geo = hf_geonorm.convert(stock, geo_alpha=steps, geo_max_angle=None)

    def layer_steps(k):
        sizes = iter(steps[2 * k : 2 * k + 2])  # the written-out block updates attention first
        return lambda x, u: geodesic_step(x, u, next(sizes), None)

    torch.testing.assert_close(logits(geo, ids), reference_logits(stock, "llama", ids, layer_steps), atol=1e-6,
                               rtol=1e-5)  # fmt: skip
    per_layer = hf_geonorm.convert(stock, geo_alpha=steps[::2], geo_max_angle=None)
    doubled = hf_geonorm.convert(stock, geo_alpha=[a for a in steps[::2] for _ in (0, 1)], geo_max_angle=None)
    torch.testing.assert_close(logits(doubled, ids), logits(per_layer, ids), atol=0, rtol=0)
    with pytest.raises(ValueError, match=rf"one value per layer \({num_layers}\) or one per update"):
        hf_geonorm.convert(stock, geo_alpha=steps[:-1])
    parallel = stock_model("gpt_neox-parallel")
    with pytest.raises(ValueError, match="parallel blocks make one update per layer"):
        hf_geonorm.convert(parallel, geo_alpha=[0.1] * (2 * len(layers_of(parallel))))


def test_first_token_prenorm_moves_position_zero_by_x_plus_u_with_and_without_cache():
    stock, ids = stock_model("llama"), token_ids()
    num_layers = len(layers_of(stock))
    geo = hf_geonorm.convert(stock, geo_first_token_prenorm=True)
    sizes = [0.5 / k for k in range(1, num_layers + 1)]  # the documented default: harmonic, alpha 0.5

    def layer_steps(k):
        def step(x, u):
            first = torch.zeros(x.shape[:-1] + (1,), dtype=torch.bool)
            first[:, 0] = True  # no cache, no padding: position id 0 is the first column
            return torch.where(first, x + u, geodesic_step(x, u, sizes[k], PI4))

        return step

    torch.testing.assert_close(logits(geo, ids), reference_logits(stock, "llama", ids, layer_steps), atol=1e-6,
                               rtol=1e-5)  # fmt: skip
    # decoding with the cache (later positions are not 0) gives the full forward's logits
    with torch.no_grad():
        prefix = geo(ids[:, :-3], use_cache=True)
        cache, steps = prefix.past_key_values, []
        for i in range(ids.shape[1] - 3, ids.shape[1]):
            out = geo(ids[:, i : i + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), logits(geo, ids)[:, -3:], atol=1e-5, rtol=1e-5)
    # left padding: the first real token has position id 0 (as generate computes it), the pads do not matter
    pad = torch.full((1, 3), 0)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids[:1])], 1)
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0).masked_fill(mask == 0, 1)
    with torch.no_grad():
        padded = geo(torch.cat([pad, ids[:1]], 1), attention_mask=mask, position_ids=position_ids).logits[:, 3:]
    torch.testing.assert_close(padded, logits(geo, ids[:1]), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits(hf_geonorm.convert(stock), ids), logits(geo, ids))  # the option acts
    with pytest.raises(ValueError, match="geo_first_token_prenorm needs each sequence's first token"):
        hf_geonorm.convert(stock_model("gpt_neo"), geo_first_token_prenorm=True)  # layers get no ids: refused at once


def test_per_update_bridges_frames_and_final_clamp_equal_the_written_out_updates():
    """A LLaMA with some updates Pre-Norm (in the frame c: x -> (c_next / c)(x + c u)), some pure GeoNorm with
    only the final angle clamped, one half-way: each update computes its own formula, the first token the framed
    Pre-Norm update; all bridges 0 is the stock model."""
    stock, ids = stock_model("llama"), token_ids()
    n = 2 * len(layers_of(stock))
    bridges = [0.0, 1.0, 0.5, 0.0, 1.0, 1.0][:n]
    frames = [1.0, 0.5, 0.4, 0.3, 0.25, 0.2][:n]
    alphas = [0.4, 0.05, 0.3, 0.2, 0.1, 0.15][:n]
    settings = dict(geo_alpha=alphas, geo_frames=frames, geo_clamp="final", geo_max_angle=1.0,
                    geo_first_token_prenorm=True)  # fmt: skip
    geo = hf_geonorm.convert(stock, geo_bridge=bridges, **settings)

    def update(j, x, u):
        x, u = x.double(), u.double()
        c, r = frames[j], (frames[j + 1] / frames[j] if j + 1 < n else 1.0)
        pre = r * (x + c * u)
        xn = x.norm(dim=-1, keepdim=True)
        t = u - (u * x).sum(-1, keepdim=True) / xn**2 * x
        tn = t.norm(dim=-1, keepdim=True)
        theta_pre = torch.atan2(c * tn, xn + c * (u * x).sum(-1, keepdim=True) / xn)
        theta = (1 - bridges[j]) * theta_pre + bridges[j] * torch.clamp(alphas[j] * tn / xn, max=1.0)
        radius = (1 - bridges[j]) * pre.norm(dim=-1, keepdim=True) + bridges[j] * xn
        out = pre if bridges[j] == 0.0 else radius * (torch.cos(theta) * x / xn + torch.sin(theta) * t / tn)
        out[:, 0] = pre[:, 0]
        return out.float()

    def layer_steps(k):
        calls = iter(range(2 * k, 2 * k + 2))  # attention, then feed-forward
        return lambda x, u: update(next(calls), x, u)

    torch.testing.assert_close(logits(geo, ids), reference_logits(stock, "llama", ids, layer_steps), atol=1e-5,
                               rtol=1e-5)  # fmt: skip
    assert len({round(v, 4) for v in (logits(geo, ids)[0, -1, :3].tolist())}) > 1
    stock = copy.deepcopy(stock)  # the session's cached stock model is shared: changed here, it would change others
    for module in stock.modules():  # every update Pre-Norm in its frame is the stock model, but for the norms' eps
        if hasattr(module, "variance_epsilon"):
            module.variance_epsilon = 1e-12
    exact = hf_geonorm.convert(stock, geo_bridge=[0.0] * n, **settings)
    torch.testing.assert_close(logits(exact, ids), logits(stock, ids), atol=1e-5, rtol=1e-5)


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


def test_the_step_schedule_is_computed_once_per_model_and_again_after_an_assignment(monkeypatch):
    """Every residual module of a model reads one schedule: two forwards compute the step sizes once, an assigned
    ``geo_alpha`` (or ``geo_bridge``) once more and changes the outputs; the modules of a copy read the copy's."""
    from hf_geonorm.modeling import residual

    computed = []
    real = residual.step_sizes
    monkeypatch.setattr(residual, "step_sizes", lambda *args: computed.append(args) or real(*args))
    geo = hf_geonorm.convert(stock_model("llama"), geo_alpha=0.5)
    first = logits(geo)
    torch.testing.assert_close(logits(geo), first)
    assert len(computed) == 1
    geo.config.geo_alpha = 0.25
    halved = logits(geo)
    assert len(computed) == 2 and not torch.allclose(halved, first)
    torch.testing.assert_close(halved, logits(hf_geonorm.convert(stock_model("llama"), geo_alpha=0.25)))
    geo.config.geo_bridge = 0.0
    torch.testing.assert_close(logits(geo), logits(stock_model("llama")))  # the bridges are the schedule's too
    copied = copy.deepcopy(geo)
    copied.config.geo_bridge = 1.0
    torch.testing.assert_close(logits(copied), halved)
    torch.testing.assert_close(logits(geo), logits(stock_model("llama")))
