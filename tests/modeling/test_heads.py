"""Every head the stock model has: for each case of tests/support/tiny_models.py and each of sequence
classification, token classification and question answering that its stock type has in transformers.

For each: ``pre`` gives the stock head's outputs with the stock head's state dict; a GeoNorm causal-LM checkpoint
loads into the head through its Auto class with only the head's weights new; ``geo`` keeps every token on its
sphere; save -> reload through the Auto class gives the same outputs. Then: LoRA sequence classification with
Trainer on a small real task (Python source or English prose, both from the standard library) beats chance
clearly, and a classification folder loads as remote code where hf_geonorm is not installed.
"""

from __future__ import annotations

import ast
import functools
import json

import pytest
import torch
import transformers
from transformers.models.auto import modeling_auto

import hf_geonorm
from hf_geonorm.training.data.corpus import stdlib_files

from support.tiny_models import CASES, layer_outputs, layers_of, stock_model, tiny_config, token_ids

# The Auto classes of the heads, each with transformers' own table of the stock types that have that head.
HEAD_TABLES = {
    "AutoModelForSequenceClassification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    "AutoModelForTokenClassification": modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    "AutoModelForQuestionAnswering": modeling_auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
}
HEAD_CASES = [
    (name, auto) for name, case in CASES.items() for auto, table in HEAD_TABLES.items() if case.model_type in table
]
# One case per model type: the block variants of a type (falcon's, gpt_neox's...) share its heads and loading.
FIRST_CASES = {case.model_type: name for name, case in reversed(CASES.items())}.values()
HEAD_TYPES = [(name, auto) for name, auto in HEAD_CASES if name in FIRST_CASES]
LABELS = 3


def head_id(value):
    return value.removeprefix("AutoModelFor") if value in HEAD_TABLES else value


def outputs(model, ids=None) -> dict[str, torch.Tensor]:
    """The head's scores: ``logits``, or ``start_logits`` and ``end_logits`` of question answering."""
    with torch.no_grad():
        out = model(ids if ids is not None else token_ids())
    return {key: value for key, value in out.items() if key.endswith("logits")}


def assert_outputs_close(got: dict, expected: dict, atol: float) -> None:
    assert got.keys() == expected.keys() and got
    for key in expected:
        assert (got[key] - expected[key]).abs().max() <= atol, key


@functools.cache
def stock_head(case: str, auto: str):
    """A tiny random stock head of a case (pad token 0: sequence classification needs one for batches), with
    0.02 N(0, 1) added to every parameter as tiny_models.stock_model does. Tests must not modify it."""
    stock_class = getattr(transformers, HEAD_TABLES[auto][CASES[case].model_type])
    torch.manual_seed(0)
    model = stock_class(tiny_config(case, pad_token_id=0, num_labels=LABELS)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return model


def test_every_family_has_the_heads_of_its_stock_type():
    """Written out from transformers' tables, without building a family."""
    for model_type in hf_geonorm.supported_architectures():
        family = hf_geonorm.family_for(model_type)
        expected = {auto for auto, table in HEAD_TABLES.items() if model_type in table}
        assert set(family.head_class_names) == expected, model_type
        for auto in expected:  # GeoNorm + the stock head's name
            assert family.head_class_names[auto] == "GeoNorm" + HEAD_TABLES[auto][model_type], (model_type, auto)


@pytest.mark.parametrize(("case", "auto"), HEAD_CASES, ids=head_id)
def test_pre_equals_the_stock_head(case, auto):
    stock = stock_head(case, auto)
    family = hf_geonorm.family_for(CASES[case].model_type)
    # the stock head sits on the stock base model, the one GeoNorm replaces
    assert type(getattr(stock, stock.base_model_prefix)) is family.stock_base_class
    expected = outputs(stock)

    built = family.head_classes[auto](family.config_class(**stock.config.to_dict(), norm_style="pre")).eval()
    assert type(built).__name__ == f"GeoNorm{type(stock).__name__}"
    assert isinstance(built, type(stock)) and isinstance(built.base_model, family.base_class)
    assert all(type(layer).__name__.startswith("GeoNorm") for layer in layers_of(built))
    # the same state dict; the base model under the causal LM's name (question answering's "transformer" -> "model")
    old, new = stock.base_model_prefix + ".", family.stock_causal_class.base_model_prefix + "."
    state = {
        (new + key[len(old) :] if key.startswith(old) else key): value for key, value in stock.state_dict().items()
    }
    built.load_state_dict(state, strict=True)
    assert_outputs_close(outputs(built), expected, atol=1e-6)

    # convert: the stock head itself, as a new object of the same GeoNorm class; the stock head is left alone
    converted = hf_geonorm.convert(stock, norm_style="pre")
    assert type(converted) is type(built)
    assert_outputs_close(outputs(converted), expected, atol=1e-6)
    assert_outputs_close(outputs(stock), expected, atol=0)
    geo = hf_geonorm.convert(stock, norm_style="geo", geo_alpha=1.0)
    assert max((outputs(geo)[k] - expected[k]).abs().max() for k in expected) > 1e-4  # geo differs


@pytest.fixture(scope="session")
def causal_folders(tmp_path_factory):
    """A saved GeoNorm causal LM per case (``geo``), made on first use: case -> (folder, model)."""
    root, made = tmp_path_factory.mktemp("causal"), {}

    def folder(case: str):
        if case not in made:
            model = hf_geonorm.convert(stock_model(case), norm_style="geo", geo_alpha=0.75, geo_decay="sqrt")
            model.save_pretrained(root / case)
            made[case] = root / case, model
        return made[case]

    return folder


@pytest.mark.parametrize(("case", "auto"), HEAD_TYPES, ids=head_id)
def test_a_causal_checkpoint_loads_into_the_head_keeps_the_sphere_and_reloads(case, auto, causal_folders, tmp_path):
    folder, causal = causal_folders(case)
    family = hf_geonorm.family_for(CASES[case].model_type)
    auto_class = getattr(transformers, auto)
    head, info = auto_class.from_pretrained(folder, num_labels=LABELS, pad_token_id=0, output_loading_info=True)
    head.eval()
    assert type(head) is family.head_classes[auto]
    # only the head's own weights are new; what is left over is the causal LM's own head
    prefix = family.stock_causal_class.base_model_prefix + "."
    assert info["missing_keys"] == {key for key in head.state_dict() if not key.startswith(prefix)}
    assert all(not key.startswith(prefix) for key in info["unexpected_keys"])
    assert not info["mismatched_keys"]
    ids = token_ids()
    with torch.no_grad():
        expected_state = causal.base_model(ids).last_hidden_state
        assert (head.base_model(ids).last_hidden_state - expected_state).abs().max() <= 1e-6

    # geo keeps every token on its sphere: each layer's output (the last one before the final norm) has the norm
    # of the token's entry into the stack
    entry, layer_states = layer_outputs(head, ids)
    assert len(layer_states) == len(layers_of(causal))
    for state in layer_states:
        torch.testing.assert_close(state.norm(dim=-1), entry.norm(dim=-1), rtol=1e-5, atol=0)

    head.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"][auto] == f"modeling_geonorm.{family.head_classes[auto].__name__}"
    reloaded, info = auto_class.from_pretrained(tmp_path, output_loading_info=True)
    assert type(reloaded) is type(head)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    # bit-equal except where a MoE expert kernel rounds differently in a new instance (ernie4_5_moe: 3e-8)
    assert_outputs_close(outputs(reloaded.eval(), ids), outputs(head, ids), atol=1e-6)


# ---- a small real task: is a 64-character snippet Python source or English prose? ----

SNIPPET = 64
EOS = 2  # appended: the classifier reads the last token, which then sums up the snippet


def _snippets(text: str) -> list[str]:
    text = " ".join(text.split())
    return [text[i : i + SNIPPET] for i in range(0, len(text) - SNIPPET + 1, SNIPPET)]


def prose_and_code(files, per_class: int) -> tuple[list[str], list[str]]:
    """Docstrings (prose) and function bodies without docstring or comment lines (code) of stdlib modules, with
    whitespace runs made single spaces, cut into snippets; ``per_class`` of each."""
    prose: list[str] = []
    code: list[str] = []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            docstring = ast.get_docstring(node)
            if docstring:
                prose += _snippets(docstring)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[1:] if docstring else node.body
                if body:
                    kept = [ln for ln in lines[body[0].lineno - 1 : node.end_lineno] if not ln.lstrip().startswith("#")]
                    code += _snippets("\n".join(kept))
        if len(prose) >= per_class and len(code) >= per_class:
            return prose[:per_class], code[:per_class]
    raise AssertionError("the standard library has too little source for the task")


class SnippetDataset(torch.utils.data.Dataset):
    """Snippets as ASCII token ids (the tiny vocabulary is 128) with EOS appended; label 0 prose, 1 code."""

    def __init__(self, prose: list[str], code: list[str]) -> None:
        texts = [(text, 0) for text in prose] + [(text, 1) for text in code]
        self.ids = torch.tensor([[min(ord(ch), 127) for ch in text] + [EOS] for text, _ in texts])
        self.labels = torch.tensor([label for _, label in texts])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


def accuracy(model, data: SnippetDataset) -> float:
    with torch.no_grad():
        return (model(input_ids=data.ids).logits.argmax(-1) == data.labels).float().mean().item()


def test_lora_sequence_classification_learns_python_from_prose_and_saves_the_head(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

    files = stdlib_files()
    train = SnippetDataset(*prose_and_code(files[0::2], 400))
    held_out = SnippetDataset(*prose_and_code(files[1::2], 150))  # other modules than the training ones
    config = hf_geonorm.GeoNormLlamaConfig(**tiny_config("llama", num_hidden_layers=2).to_dict(), geo_alpha=1.0)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "base")
    base = AutoModelForSequenceClassification.from_pretrained(tmp_path / "base")  # num_labels: 2, the default
    assert type(base) is hf_geonorm.GeoNormLlamaForSequenceClassification
    model = get_peft_model(base, LoraConfig(task_type="SEQ_CLS", r=16, lora_alpha=32))  # PEFT's default targets
    lora = {name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in model.named_parameters() if ".lora_A" in name}
    assert lora == {"q_proj", "v_proj"}
    assert "score" in model.modules_to_save
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=32,
        num_train_epochs=4,
        learning_rate=3e-2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=train).train()
    model.eval()
    trained = accuracy(model, held_out)
    assert trained >= 0.8, f"held-out accuracy {trained:.3f}"

    model.save_pretrained(tmp_path / "adapter")
    from safetensors import safe_open

    with safe_open(tmp_path / "adapter" / "adapter_model.safetensors", "pt") as saved:
        keys = list(saved.keys())
    assert any(".score." in key for key in keys) and any("lora_A" in key for key in keys)
    fresh = AutoModelForSequenceClassification.from_pretrained(tmp_path / "base")
    assert accuracy(fresh, held_out) < 0.7  # the trained head and adapters are what learnt the task
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    torch.testing.assert_close(reloaded(input_ids=held_out.ids).logits, model(input_ids=held_out.ids).logits)


REMOTE_HEADS = """
import transformers
ids = torch.tensor(job["ids"])
for name, (auto, folder) in job["folders"].items():
    model = getattr(transformers, auto).from_pretrained(folder, trust_remote_code=True).eval()
    report[name] = [type(model).__name__, type(model).__module__.split(".")[0], type(model.base_model).__name__]
    with torch.no_grad():
        out = model(ids)
    results[name] = {key: value for key, value in out.items() if key.endswith("logits")}
"""


def test_head_folders_load_as_remote_code_without_the_plugin(plugin_free_python, tmp_path):
    """Sequence classification of LLaMA (a generic transformers head, which builds its base model through
    AutoModel), question answering of LLaMA (its base model renamed) and GPT-2's token classification."""
    ids = token_ids()
    made = {}
    for name, case, auto in (
        ("llama_seq", "llama", "AutoModelForSequenceClassification"),
        ("llama_qa", "llama", "AutoModelForQuestionAnswering"),
        ("gpt2_token", "gpt2", "AutoModelForTokenClassification"),
    ):
        model = hf_geonorm.convert(stock_head(case, auto), geo_alpha=0.6).eval()
        model.save_pretrained(tmp_path / name)
        made[name] = auto, model
    job = {"ids": ids.tolist(), "folders": {name: (auto, str(tmp_path / name)) for name, (auto, _) in made.items()}}
    report, results = plugin_free_python.run(REMOTE_HEADS, job, tmp_path / "child")
    for name, (_, model) in made.items():
        class_name, package, base_name = report[name]
        assert class_name == type(model).__name__ and package == "transformers_modules", name
        assert base_name == type(model.base_model).__name__
        assert_outputs_close(results[name], outputs(model, ids), atol=1e-6)


@pytest.mark.parametrize(
    ("auto", "task"),
    [
        ("AutoModelForCausalLM", "text-generation"),
        ("AutoModelForSequenceClassification", "text-classification"),
        ("AutoModelForTokenClassification", "token-classification"),
        ("AutoModelForQuestionAnswering", "question-answering"),
    ],
)
def test_the_card_of_a_head_names_its_task_and_auto_class(auto, task, tmp_path):
    """A head's card is not a text-generation card: the Hub task and the loading examples follow the head."""
    import yaml

    from hf_geonorm.sharing.card_metadata import validate_card
    from hf_geonorm.sharing.model_card import write_model_card

    config = hf_geonorm.convert(stock_model("llama")).config
    getattr(transformers, auto).from_config(config).save_pretrained(tmp_path)
    card = write_model_card(tmp_path).read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["pipeline_tag"] == task
    assert f"{auto}.from_pretrained(" in card
    others = {"AutoModelForCausalLM", "AutoModelForSequenceClassification", "AutoModelForTokenClassification",
              "AutoModelForQuestionAnswering"} - {auto}  # fmt: skip
    assert not any(other in card for other in others)
    assert validate_card(card, geonorm=True) == []
