"""Running a model on real text: reading the text, token windows, perplexity, and finding out why a metric is
not finite.

``measure_perplexity`` is what ``hf-geonorm perplexity`` prints; ``perplexity`` works on any model and windows.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._plumbing.text_files import read_text
from ..checkpoints.loading import Source, load_model, load_tokenizer, open_source, resolve_settings
from ..checkpoints.patching import apply_geonorm
from ..errors import NonFiniteError
from ..modeling.residual import GeoNormResidual, residual_modules
from .defaults import PERPLEXITY_TOKENS

BYTES_TOKENIZATION = "raw UTF-8 bytes modulo the vocabulary size (the source has no tokenizer)"
CHARS_PER_TOKEN_BOUND = 32  # no tokenizer here makes a token of more than 32 characters' worth of text
MAX_EXP_ARGUMENT = math.log(sys.float_info.max)
LOGITS_CHUNK_BYTES = 64 * 2**20  # float32 logits held at once: 341 positions of SmolLM2's 49,152 tokens
LARGE_MEMORY_BYTES = 10**9  # a measurement estimated to need more (1 GB) is stated before it starts
# A window's activations at their peak, in values per token: a few states of the model's width (the residual stream,
# an update's normed input, queries, keys, values, its output) and of the MLP's inner width. SmolLM2-135M's peak grew
# by 0.18 GB from 2,048 to 8,192 tokens, 7,300 float32 values a token: 8 x 576 + 2 x 1,536 is 7,680.
STATES_PER_TOKEN, INNER_STATES_PER_TOKEN = 8, 2


def context_length(config: Any) -> int:
    """The longest sequence the model takes (2048 when the config does not say)."""
    for key in ("max_position_embeddings", "n_positions", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def encode(text: str, tokenizer: Any, vocab_size: int, label: str = "the model") -> tuple[list[int], str]:
    """Token ids of ``text`` and how they were made (the tokenizer, or UTF-8 bytes modulo the vocabulary).

    ``ValueError`` when the tokenizer gives ids the model has no embedding for (a tokenizer of another model).
    """
    if tokenizer is None:
        ids = [b % vocab_size for b in text.encode("utf-8")]
        return ids, BYTES_TOKENIZATION
    ids = list(tokenizer(text)["input_ids"])
    largest = max(ids, default=0)
    if largest >= vocab_size:
        raise ValueError(
            f"{label}: its tokenizer gives token id {largest}, but config.json has vocab_size {vocab_size}; the "
            "tokenizer does not belong to this model (use the model's own tokenizer, or fix vocab_size)"
        )
    return ids, f"the model's tokenizer ({type(tokenizer).__name__})"


def split_windows(ids: list[int], max_tokens: int, window: int) -> list[list[int]]:
    """Consecutive, non-overlapping windows over the first ``max_tokens`` ids (each at least 2 long)."""
    if window < 2 or max_tokens < 2:
        raise ValueError(f"window and max_tokens must be at least 2; got {window} and {max_tokens}")
    ids = ids[:max_tokens]
    out = [w for w in (ids[i : i + window] for i in range(0, len(ids), window)) if len(w) >= 2]
    if not out:
        raise ValueError("the text gives fewer than 2 tokens; give a longer text")
    return out


def text_windows(
    model: nn.Module,
    tokenizer: Any,
    text_path: str | os.PathLike,
    max_tokens: int,
    window: int | None = None,
    label: str = "the model",
) -> tuple[list[list[int]], str]:
    """The token windows of the text file for ``model`` (at most its context long) and how they were made."""
    text = read_text(text_path, max_tokens * CHARS_PER_TOKEN_BOUND)
    ids, how = encode(text, tokenizer, model.config.vocab_size, label)
    size = min(window or context_length(model.config), context_length(model.config), max_tokens)
    return split_windows(ids, max_tokens, size), how


def _progress(items: list, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="window", leave=False, disable=len(items) < 2)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _forward(model: nn.Module, ids: torch.Tensor) -> Any:
    """A forward pass that keeps nothing it does not return: no key/value cache (30 layers of keys and values of
    an 8,192-token window are 0.4 GB on SmolLM2), no hidden states or attention weights."""
    return model(input_ids=ids, use_cache=False, output_hidden_states=False, output_attentions=False)


def _final_states(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The states the output head reads, [1, T, d]: the base model's last hidden state, without the logits."""
    return model.base_model(input_ids=ids, use_cache=False, output_hidden_states=False,
                            output_attentions=False).last_hidden_state  # fmt: skip


PROBE_TOKENS = 8


def head_is_plain(model: nn.Module, window: list[int]) -> bool:
    """Whether the model's logits are its output head applied to the final states, and nothing more (checked on
    the first ``PROBE_TOKENS`` tokens of ``window``): then they can be computed a chunk of positions at a time. A
    model that scales or caps its logits after the head (Gemma 2's soft-capping, Cohere's scale) is not."""
    head = model.get_output_embeddings()
    if head is None:
        return False
    ids = torch.tensor([window[:PROBE_TOKENS]], device=_device(model))
    with torch.inference_mode():
        whole = _forward(model, ids).logits
        parts = head(_final_states(model, ids))
    return whole.shape == parts.shape and bool(torch.allclose(whole.float(), parts.float(), rtol=1e-4, atol=1e-5))


def chunk_positions(vocab_size: int, chunk_bytes: int = LOGITS_CHUNK_BYTES) -> int:
    """Positions per chunk of float32 logits of ``chunk_bytes`` at most (at least one)."""
    return max(1, chunk_bytes // (4 * vocab_size))


def window_logits(model: nn.Module, window: list[int], chunk: int | None, plain: bool) -> Iterator[torch.Tensor]:
    """The float32 logits of the window's positions but the last ([T - 1, vocab] in all), ``chunk`` positions at a
    time where the head is ``plain`` (``head_is_plain``): the head runs on each chunk of the final states, so no
    [T, vocab] tensor is ever held. Otherwise (or ``chunk`` None) the model's own logits, whole. Call it under
    ``torch.inference_mode``."""
    ids = torch.tensor([window], device=_device(model))
    if chunk is None or not plain:
        yield _forward(model, ids).logits[0, :-1].float()
        return
    states = _final_states(model, ids)[0, :-1]
    head = model.get_output_embeddings()
    for start in range(0, states.shape[0], chunk):
        yield head(states[start : start + chunk]).float()


def perplexity(model: nn.Module, windows: list[list[int]], desc: str = "perplexity", chunk: int | None = -1) -> float:
    """exp(mean next-token negative log-likelihood) over the windows (NaN or inf when the model's are), with the
    logits and the loss computed ``chunk`` positions at a time (-1: ``chunk_positions`` of the vocabulary; None:
    the whole window's logits at once, as the model returns them)."""
    if chunk == -1:
        chunk = chunk_positions(model.config.vocab_size)
    plain = chunk is not None and head_is_plain(model, windows[0])
    total, count = 0.0, 0
    with torch.inference_mode():
        for w in _progress(windows, desc):
            targets = torch.tensor(w[1:], device=_device(model))
            start = 0
            for logits in window_logits(model, w, chunk, plain):
                end = start + logits.shape[0]
                total += float(torch.nn.functional.cross_entropy(logits, targets[start:end], reduction="sum"))
                start = end
            count += len(w) - 1
    mean = total / count
    if math.isnan(mean):
        return math.nan
    return math.exp(mean) if mean < MAX_EXP_ARGUMENT else math.inf


def read_with_hooks(model: nn.Module, windows: list[list[int]], hooks: list[tuple[nn.Module, Any]]) -> None:
    """Run ``model``'s body over the token ``windows`` (one forward each, no gradients, no logits: the hooks see
    the residual updates) with each ``(module, hook)`` registered as a forward hook; the hooks are removed
    afterwards, also on an error."""
    handles = [module.register_forward_hook(hook) for module, hook in hooks]
    device = _device(model)
    try:
        with torch.no_grad():  # not inference_mode: a hook may keep a tensor that later computations take
            for window in windows:
                _final_states(model, torch.tensor([window], device=device))
    finally:
        for handle in handles:
            handle.remove()


def _settings_text(module: GeoNormResidual) -> str:
    if module.norm_style != "geo":
        return "the stock update" if module.norm_style == "pre" else f"norm_style {module.norm_style}"
    config = module.config
    clamp = config.geo_max_angle
    return (
        f"step size {module.step_size:.4g} from geo_alpha and geo_decay, geo_max_angle "
        f"{'None (no clamp)' if clamp is None else f'{clamp:.4g}'}, geo_bridge {module.bridge:.4g}"
    )


def explain_non_finite(model: nn.Module, windows: list[list[int]]) -> str:
    """Why the model's outputs on ``windows`` are not finite: the weights, the dtype, or the residual update
    (with its GeoNorm settings) where the first non-finite value appears."""
    dtype = next(model.parameters()).dtype
    half = dtype in (torch.float16, torch.bfloat16)
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        hint = f" (in {dtype}: values beyond its range; use dtype float32)" if half else ""
        return f"the weights hold non-finite values{hint}: {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}"
    first: list[str] = []

    def make_hook(layer: int, sublayer: str) -> Any:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            out = output[0] if isinstance(output, tuple) else output
            if not first and torch.isfinite(args[0]).all() and not torch.isfinite(out).all():
                first.append(f"the {sublayer} update of layer {layer} ({_settings_text(module)})")

        return hook

    chunk = chunk_positions(model.config.vocab_size)
    plain = head_is_plain(model, windows[0])  # before the hooks: they watch the windows' own forward passes
    handles = [module.register_forward_hook(make_hook(k, name)) for k, name, module in residual_modules(model)]
    finite_outputs = True
    try:
        with torch.inference_mode():
            for w in windows:
                for logits in window_logits(model, w, chunk, plain):
                    finite_outputs = finite_outputs and bool(torch.isfinite(logits).all())
                if first or not finite_outputs:
                    break
    finally:
        for handle in handles:
            handle.remove()
    if finite_outputs:
        return "the outputs are finite, but the mean loss is too large for exp (the model is confidently wrong)"
    where = first[0] if first else "outside the residual updates (embedding, final norm or output head)"
    if half:
        return f"the first non-finite value comes from {where}, in {dtype} (use dtype float32)"
    return f"the first non-finite value comes from {where}"


def check_finite(value: float, what: str, model: nn.Module, windows: list[list[int]]) -> float:
    """``value``, or ``NonFiniteError`` saying why the model made it NaN or infinite."""
    if math.isfinite(value):
        return value
    said = "NaN" if math.isnan(value) else "infinite"
    raise NonFiniteError(f"{what} is {said}: {explain_non_finite(model, windows)}")


def prepare_model(
    source: Source | str,
    dtype: str = "float32",
    device: str = "cpu",
    settings: dict[str, Any] | None = None,
    allow_missing: bool = False,
) -> tuple[nn.Module, Any, Source]:
    """The model to measure, its tokenizer and its ``Source``: loaded, converted in memory when ``settings``
    are given (a stock model otherwise becomes ``norm_style="pre"``: the same computation, with residual
    modules to observe), and moved to ``device``."""
    src = source if isinstance(source, Source) else open_source(source)
    chosen = resolve_settings(settings, src) if settings else None
    tokenizer = load_tokenizer(src)  # first: one that needs custom code is refused before the weights load
    model = load_model(src, dtype, allow_missing=allow_missing)
    if chosen is not None:
        apply_geonorm(model, **chosen)
    elif not src.is_geonorm:
        apply_geonorm(model, norm_style="pre")
    try:
        model.to(device)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(f"cannot use device {device!r}: {str(error).splitlines()[0]}") from None
    return model, tokenizer, src


@dataclass
class MemoryEstimate:
    """What measuring a model on windows of ``window`` tokens holds at once, in bytes: its ``weights``, a window's
    ``activations`` (no cache, no gradients) and the float32 ``logits`` of ``positions`` positions (a chunk)."""

    window: int
    weights: int
    activations: int
    logits: int
    positions: int

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.logits

    def line(self) -> str:
        return (
            f"memory: about {self.total / 1e9:.2f} GB for {self.window:,}-token windows: weights {self.weights:,} "
            f"bytes, a window's activations about {self.activations / 1e9:.2f} GB, its logits "
            f"{self.logits / 1e9:.2f} GB at a time ({self.positions:,} positions); --window sets shorter windows"
        )


def measurement_memory(model: nn.Module, window: int, chunk: int | None) -> MemoryEstimate:
    """The memory ``perplexity`` needs for ``model`` on windows of ``window`` tokens, logits ``chunk`` positions
    at a time (None: the whole window's): the weights as they are, a window's activations by ``STATES_PER_TOKEN``
    and ``INNER_STATES_PER_TOKEN``, and the logits with their log-softmax."""
    config = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    width = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * width
    item = next(model.parameters()).element_size()
    activations = window * item * (STATES_PER_TOKEN * width + INNER_STATES_PER_TOKEN * inner)
    positions = window - 1 if chunk is None else min(chunk, window - 1)
    return MemoryEstimate(window, weights, activations, 2 * positions * config.vocab_size * 4, positions)


@dataclass
class PerplexityReport:
    """What ``measure_perplexity`` found."""

    perplexity: float
    tokens: int
    windows: int
    tokenization: str


def measure_perplexity(
    source: Source | str,
    text_path: str | os.PathLike,
    max_tokens: int = PERPLEXITY_TOKENS,
    window: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    settings: dict[str, Any] | None = None,
    allow_missing: bool = False,
    log: Callable[[str], None] | None = None,
) -> PerplexityReport:
    """Perplexity of ``source`` (folder, .gguf or Hub id; converted in memory with ``settings``) on the first
    ``max_tokens`` tokens of a text file, over non-overlapping windows. ``log`` gets the memory it will take
    (``measurement_memory``) first where that is above ``LARGE_MEMORY_BYTES``. ``NonFiniteError`` (a
    ``ValueError``) when it is not finite, saying where and why."""
    model, tokenizer, src = prepare_model(source, dtype, device, settings, allow_missing)
    windows, how = text_windows(model, tokenizer, text_path, max_tokens, window, src.spec)
    memory = measurement_memory(model, max(len(w) for w in windows), chunk_positions(model.config.vocab_size))
    if log is not None and memory.total > LARGE_MEMORY_BYTES:
        log(memory.line())
    value = check_finite(perplexity(model, windows), "the perplexity", model, windows)
    return PerplexityReport(value, sum(len(w) for w in windows), len(windows), how)
