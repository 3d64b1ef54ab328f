"""A tiny LLaMA checkpoint in llama.cpp's GGUF format (float32 tensors, or the weight matrices quantised), written
with the ``gguf`` package."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tiny_gguf(path: Path, skip: str | None = None, vocab=300, hidden=32, ffn=64, layers=2, heads=4, kv_heads=2,
                    stated: dict[str, int] | None = None, metadata: dict[str, str | int] | None = None,
                    quantised: str | None = None):  # fmt: skip
    """Write the GGUF file ``path``, without the tensor named ``skip`` when given. ``stated`` overrides what the
    metadata says of the sizes (``block_count``, ``embedding_length``), not the tensors written; ``metadata`` adds
    ``general.*`` keys (strings, or whole numbers), as llama.cpp's converter writes them; ``quantised`` names a
    quantisation type (``"Q4_1"``) the weight matrices are stored in (the norms stay F32, as llama.cpp keeps
    them)."""
    import gguf
    from gguf import quants

    stated = {"block_count": layers, "embedding_length": hidden, **(stated or {})}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(stated["block_count"])
    writer.add_context_length(64)
    writer.add_embedding_length(stated["embedding_length"])
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_vocab_size(vocab)
    writer.add_file_type(0)
    writer.add_license("apache-2.0")
    for key, value in (metadata or {}).items():
        (writer.add_uint32 if isinstance(value, int) else writer.add_string)(key, value)
    kv = kv_heads * hidden // heads
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,), "output.weight": (vocab, hidden)}
    block = {
        "attn_norm": (hidden,), "ffn_norm": (hidden,), "attn_q": (hidden, hidden), "attn_k": (kv, hidden),
        "attn_v": (kv, hidden), "attn_output": (hidden, hidden), "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }  # fmt: skip
    for i in range(layers):
        shapes.update({f"blk.{i}.{name}.weight": shape for name, shape in block.items()})
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        if name == skip:
            continue
        values = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if quantised is not None and len(shape) == 2:
            kind = gguf.GGMLQuantizationType[quantised]
            writer.add_tensor(name, quants.quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
