"""Converting a checkpoint (a folder, a ``.gguf`` file or a Hub id) into a GeoNorm folder, written all or nothing.

``convert_checkpoint`` is ``hf-geonorm convert``: open the source, settle the settings, load the weights strictly,
optionally measure perplexity before and after, convert, and save weights, config, remote code, tokenizer and
model card into a temporary folder that becomes the output only when complete (``atomic.atomic_directory``).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._plumbing.atomic import atomic_directory, check_output_name, check_target
from .._plumbing.full_device import full_device_as_os_error
from .._plumbing.output_lock import check_not_in_use, output_lock
from ..analysis.calibration import bridge_costs, calibrate
from ..analysis.evaluation import check_finite, perplexity, text_windows
from ..checkpoints.loading import Source, current_settings, load_model, load_tokenizer, open_source, resolve_settings
from ..checkpoints.patching import apply_geonorm
from ..modeling.settings import GeoNormSettings, computes_prenorm
from ..sharing.card_metadata import card_lineage, usable_lineage
from ..sharing.gguf_lineage import gguf_lineage
from ..sharing.hub import save_shareable
from ..sharing.model_card import CardInfo
from .options import ConversionOptions

# The fewest tokens a calibration text must give: the step sizes and frames are medians over them.
MIN_CALIBRATION_TOKENS = 64


def check_output(output_dir: str | os.PathLike, force: bool, source_path: Path | None = None) -> Path:
    """The absolute output path; ``ValueError`` when it overlaps the source (which is never modified), also through
    a symbolic link in the source that leads into the output (a Hub cache snapshot is made of such links); then
    ``check_target``: ``FileExistsError`` when it is a file or is not empty (without ``force``), ``ValueError``
    when ``force`` would replace a folder that is not an earlier output of hf-geonorm."""
    output = check_output_name(output_dir, force)
    check_not_in_use(output, "OUTPUT_DIR")  # a run writing there, or an overlap, is the mistake to name first
    if source_path is not None:
        src, out = source_path.resolve(), output.resolve()
        if src == out or out in src.parents or src in out.parents:
            raise ValueError(
                f"the output {output_dir} overlaps the source {source_path}; the source is never modified, "
                "choose another folder"
            )
        linked = _link_into(source_path, out)
        if linked is not None:
            raise ValueError(
                f"the source's {linked} is a symbolic link into the output {output_dir} ({linked.resolve()}): "
                "replacing the output would delete the source's own files; the source is never modified, choose "
                "another folder"
            )
    return check_target(output_dir, force)


def _link_into(source_path: Path, output: Path) -> Path | None:
    """A symbolic link in the source folder (at any depth) whose target lies in ``output``, or None."""
    if not source_path.is_dir():
        return None
    for root, dirs, files in os.walk(source_path):
        for name in dirs + files:
            entry = Path(root, name)
            if entry.is_symlink():
                target = entry.resolve()
                if target == output or output in target.parents:
                    return entry
    return None


def card_metadata(source: Source) -> dict[str, Any]:
    """base_model, the license (with license_name and license_link) and language for the model card, where the
    source tells them (its card, read by ``card_lineage`` as ``train --model`` reads one; its GGUF metadata, with
    the model's name and tensor types: ``gguf_lineage``; its Hub id); what the Hub would refuse in a card is left
    out, with a warning."""
    if source.kind == "gguf":
        return usable_lineage(gguf_lineage(source.path), str(source.path))
    found: dict[str, Any] = {"base_model": source.spec} if source.kind == "hub" else {}
    try:
        if source.kind == "hub":
            from huggingface_hub import hf_hub_download

            readme = Path(hf_hub_download(source.spec, "README.md"))
        elif (source.path / "README.md").is_file():
            readme = source.path / "README.md"
        else:
            return found
    except Exception:  # noqa: BLE001 - the card is optional
        return found
    return {**found, **card_lineage(readme)}


def output_change_warning(source: Source, chosen: dict[str, Any]) -> str | None:
    """One line when converting a Pre-Norm checkpoint to settings that compute something else (its trained
    outputs change), saying how to keep them; None when the conversion keeps what the source computes."""
    if not computes_prenorm(current_settings(source)) or computes_prenorm(chosen):
        return None
    style = chosen["norm_style"]
    what = f"geo_bridge={chosen['geo_bridge']}" if style == "geo" else f"norm_style={style}"
    return (
        f"{source.label} is a trained Pre-Norm model and {what} changes what it computes; --bridge 0 keeps it "
        "exactly, then --calibrate TEXT and `train --bridge-anneal` (--bridge-order last-first) are the measured "
        "ways on (README, 'Converting a pretrained model': for which models they held)"
    )


def check_calibration(source: Source, chosen: dict[str, Any], given: dict[str, Any]) -> None:
    """``ValueError`` when calibrated step sizes cannot apply: a source that is not Pre-Norm, a style other than
    ``geo``, or a ``geo_alpha`` given as well."""
    if not computes_prenorm(current_settings(source)):
        raise ValueError(
            f"calibration measures a Pre-Norm model's step sizes; {source.label} is a GeoNorm model with "
            f"norm_style={source.config.get('norm_style')!r}, geo_bridge={source.config.get('geo_bridge')} "
            "(calibrate its Pre-Norm original instead)"
        )
    if chosen["norm_style"] != "geo":
        raise ValueError(f"calibration sets GeoNorm step sizes; it needs norm_style geo, got {chosen['norm_style']!r}")
    if "geo_alpha" in given:
        raise ValueError("calibration sets geo_alpha itself; give either a calibration text or geo_alpha, not both")


def calibrated_settings(
    model: Any,
    tokenizer: Any,
    source: Source,
    chosen: dict[str, Any],
    given: dict[str, Any],
    text: str | os.PathLike,
    tokens: int,
) -> dict[str, Any]:
    """``chosen`` with ``geo_alpha`` and ``geo_frames`` measured on ``text`` through the (Pre-Norm) ``model``, and no
    clamp unless ``given`` names one."""
    if not getattr(model.config, "norm_style", None):
        apply_geonorm(model, norm_style="pre")  # the stock computation, with residual modules to observe
    windows, _ = text_windows(model, tokenizer, text, tokens, label=source.spec)
    count = sum(len(w) for w in windows)
    if count < MIN_CALIBRATION_TOKENS:
        raise ValueError(
            f"the calibration text {text} gives {count} token(s); calibration takes medians over tokens and needs "
            f"at least {MIN_CALIBRATION_TOKENS} (give a longer text, or a larger --calibrate-tokens)"
        )
    measured = calibrate(model, windows, chosen["geo_radius"])
    if not all(math.isfinite(a) for a in measured.step_sizes + measured.frames):
        raise ValueError(f"the calibration on {Path(text).name} gave non-finite step sizes; use more or other text")
    updated = {**chosen, "geo_alpha": measured.step_sizes, "geo_frames": measured.frames}
    if "geo_max_angle" not in given:
        updated["geo_max_angle"] = None
    return GeoNormSettings(**updated).validate(source.num_layers).to_dict()


@dataclass
class ConversionResult:
    """What ``convert_checkpoint`` wrote."""

    output: Path
    files: list[str]
    model_type: str
    settings: dict[str, Any]
    num_layers: int
    seconds: float
    perplexity_before: float | None = None
    perplexity_after: float | None = None
    evaluation: list[str] = field(default_factory=list)


def convert_checkpoint(
    source: Source | str,
    output_dir: str | os.PathLike,
    settings: dict[str, Any] | None = None,
    options: ConversionOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> ConversionResult:
    """Convert ``source`` (a checkpoint folder, a .gguf file or a Hub id) to a GeoNorm folder ``output_dir``, as
    ``options`` say (``ConversionOptions``: the dtype, the card's facts, evaluation and calibration texts).

    ``settings`` (GeoNorm config fields) update the source's own (a GeoNorm source) or the defaults; with
    ``geo_bridge=0`` the converted model computes what the source does. The output gets safetensors weights, the
    config, the remote code, the tokenizer (when the source has one) and a model card.

    Raises ``ValueError`` for a bad source, output or weights (``errors.SettingsError`` for a bad setting,
    ``errors.NonFiniteError`` for a non-finite perplexity, ``output_lock.OutputInUse`` while another run writes
    into ``output_dir``) and ``FileExistsError`` when the output appears while the conversion runs; nothing is
    written then. ``progress`` receives one line per stage.
    """
    options = options or ConversionOptions()
    force, eval_text, calibrate_text = options.force, options.eval_text, options.calibrate_text
    total = 4 + (eval_text is not None) + (calibrate_text is not None)
    stage = iter(range(1, total + 1))

    def say(line: str) -> None:
        if progress is not None:
            progress(f"[{next(stage)}/{total}] {line}")

    local = source.path if isinstance(source, Source) else Path(source)
    check_output(output_dir, force, local if local is not None and os.path.lexists(local) else None)  # fail fast
    say(f"reading {source.spec if isinstance(source, Source) else source}")
    src = source if isinstance(source, Source) else open_source(source)
    check_output(output_dir, force, src.path)
    chosen = resolve_settings(settings, src)
    if calibrate_text is not None:
        check_calibration(src, chosen, settings or {})
    change = output_change_warning(src, chosen)
    if change is not None:
        warnings.warn(change, stacklevel=2)
    started = time.perf_counter()
    before = after = None
    evaluation = []
    with (
        output_lock(output_dir, "convert", "OUTPUT_DIR"),
        atomic_directory(output_dir, force=force, command="convert") as tmp,
    ):
        tokenizer = load_tokenizer(src)  # first: one that needs custom code is refused before the weights load
        if tokenizer is None:
            warnings.warn(f"{src.spec} has no tokenizer, so {output_dir} has none either", stacklevel=2)
        say(f"loading the {src.model_type} model ({src.kind})")
        model = load_model(src, options.dtype, allow_missing=options.allow_missing)
        if eval_text is not None:
            windows, how = text_windows(model, tokenizer, eval_text, options.eval_tokens, label=src.spec)
            say(f"perplexity of the source on {Path(eval_text).name}")
            before = check_finite(perplexity(model, windows, "source perplexity"), "the source's perplexity",
                                  model, windows)  # fmt: skip
        if calibrate_text is not None:
            say(f"calibrating the step sizes on {Path(calibrate_text).name}")
            chosen = calibrated_settings(model, tokenizer, src, chosen, settings or {}, calibrate_text,
                                         options.calibrate_tokens)  # fmt: skip
        say(f"converting to geonorm_{src.stock_type}")
        apply_geonorm(model, **chosen)
        if calibrate_text is not None:
            windows_for_costs, _ = text_windows(model, tokenizer, calibrate_text, options.cost_tokens, label=src.spec)
            chosen["geo_bridge_costs"] = bridge_costs(model, windows_for_costs)
            model.config.geo_bridge_costs = chosen["geo_bridge_costs"]
        if eval_text is not None:
            after = check_finite(perplexity(model, windows, "converted perplexity"), "the converted perplexity",
                                 model, windows)  # fmt: skip
            tokens = sum(len(w) for w in windows)
            evaluation.append(
                f"perplexity on {Path(eval_text).name} ({tokens} tokens, {how}): {before:.4f} before conversion "
                f"(source), {after:.4f} after (this model)"
            )
        metadata = card_metadata(src)
        info = CardInfo(
            base_model=options.base_model or metadata.get("base_model"),
            license=options.license or metadata.get("license"),
            license_name=None if options.license else metadata.get("license_name"),
            license_link=None if options.license else metadata.get("license_link"),
            language=metadata.get("language"),
            source=src.spec if src.kind == "hub" else src.label,
            source_model=metadata.get("source_model"),
            source_tensor_types=metadata.get("source_tensor_types"),
            repo_id=options.repo_id,
            evaluation=evaluation,
        )
        say(f"writing {output_dir}")
        with full_device_as_os_error():
            save_shareable(model, tmp, tokenizer=tokenizer, card_info=info)
    output = Path(output_dir)
    return ConversionResult(
        output=output,
        files=sorted(p.name for p in output.iterdir()),
        model_type=model.config.model_type,
        settings=chosen,
        num_layers=src.num_layers,
        seconds=time.perf_counter() - started,
        perplexity_before=before,
        perplexity_after=after,
        evaluation=evaluation,
    )
