"""A GGUF file's header, read once without torch: the reader against the ``gguf`` package's own, and ``hf-geonorm
info`` on a ``.gguf`` file against what transformers reads of it (the facts are the same; torch and transformers
are not imported for them)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from support.helpers import invoke
from support.tiny_gguf import write_tiny_gguf

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny LLaMA GGUF with a license and a language, its matrices quantised, and a vocabulary of 300 tokens
    (an array longer than the header reader keeps)."""
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    write_tiny_gguf(path, metadata={"general.name": "Tiny 1M"}, quantised="Q8_0")
    return path


def with_long_arrays(path, out):
    """A copy of the GGUF ``path`` with a tokenizer's long arrays added (strings, floats) and a list of languages."""
    reader = gguf.GGUFReader(str(path))
    writer = gguf.GGUFWriter(str(out), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, value)
        elif kind == gguf.GGUFValueType.UINT32:
            writer.add_uint32(key, value)
        elif kind == gguf.GGUFValueType.FLOAT32:
            writer.add_float32(key, value)
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)])
    writer.add_array("tokenizer.ggml.scores", [float(i) for i in range(300)])
    writer.add_array("general.languages", ["en", "fr"])
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_the_header_reader_reads_what_the_gguf_package_reads(tiny_gguf, tmp_path):
    from hf_geonorm.checkpoints.gguf_header import ARRAY_KEPT, read_gguf_header

    path = with_long_arrays(tiny_gguf, tmp_path / "long.gguf")
    reader = gguf.GGUFReader(str(path))
    header = read_gguf_header(path)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own entries for the file's version and counts
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert header.array_lengths[key] == len(field.data), key
            if len(field.data) <= ARRAY_KEPT:
                assert header.fields[key] == field.contents(), key
            else:
                assert key not in header.fields
        else:
            assert header.fields[key] == pytest.approx(field.contents()), key
    assert [(t.name, t.shape, t.n_elements) for t in header.tensors] == [
        (t.name, tuple(int(n) for n in t.shape), int(t.n_elements)) for t in reader.tensors
    ]
    assert header.tensor_types() == [t.tensor_type.name for t in reader.tensors]
    (tmp_path / "not.gguf").write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ValueError, match="not.gguf as a GGUF checkpoint"):
        read_gguf_header(tmp_path / "not.gguf")


def test_info_on_a_gguf_gives_what_transformers_reads_of_it(tiny_gguf):
    from transformers import AutoConfig

    result = invoke("info", tiny_gguf, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    config = AutoConfig.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    reader = gguf.GGUFReader(str(tiny_gguf))
    assert (data["model_type"], data["num_layers"], data["hidden_size"], data["vocab_size"], data["positions"]) == (
        config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size,
        config.max_position_embeddings,
    )  # fmt: skip
    assert data["parameters"] == sum(int(t.n_elements) for t in reader.tensors)
    types = Counter(t.tensor_type.name for t in reader.tensors)
    assert data["metadata"] == {"license": "apache-2.0", "source_model": "Tiny 1M",
                                "source_tensor_types": dict(types.most_common())}  # fmt: skip


def test_info_on_a_gguf_answers_from_its_header(tiny_gguf):
    """info on SmolLM2's GGUF took 64 s, reading the header five times through transformers' config of it, to say
    what the header states: it answers from one read of the header, never reaching the folder inspection."""
    code = (
        "import json, sys\n"
        "from hf_geonorm_cli.main import cli\n"
        f"cli(['info', {str(tiny_gguf)!r}], standalone_mode=False)\n"
        "print(json.dumps('hf_geonorm.conversion.inspection' in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "model type:   llama" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) is False


def test_the_architectures_info_reads_from_the_header_are_those_transformers_reads_so_and_geonorm_converts():
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    from hf_geonorm.checkpoints.patching import supported_architectures
    from hf_geonorm.sharing.gguf_lineage import HEADER_TYPES

    for architecture, model_type in HEADER_TYPES.items():
        assert model_type in supported_architectures(), model_type
        read = GGUF_CONFIG_MAPPING[architecture]
        assert (read["block_count"], read["embedding_length"], read["context_length"], read["vocab_size"]) == (
            "num_hidden_layers", "hidden_size", "max_position_embeddings", "vocab_size"
        ), architecture  # fmt: skip
