"""``hf-geonorm``: convert checkpoints to GeoNorm, create from-scratch configs, inspect folders, measure angles.

torch, transformers and hf_geonorm are imported inside the commands, so ``--help`` answers at once.
User mistakes end in a one-line ``Error: ...`` and a non-zero exit; ``--debug`` (or HF_GEONORM_DEBUG=1)
shows the traceback of unexpected errors instead.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from .options import (
    DTYPES,
    PRESET_NAMES,
    check_settings,
    pop_settings,
    preview_settings_options,
    settings_options,
)
from .push import push
from .sources import (
    Source,
    apply_settings,
    card_metadata,
    check_supported,
    first_line,
    load_model,
    load_tokenizer,
    read_config_json,
    resolve_source,
)
from .train import train

PRESETS = PRESET_NAMES
DEFAULT_VOCAB = 50304  # hf_geonorm.presets.DEFAULT_VOCAB


class GeoNormGroup(click.Group):
    """Turns unexpected exceptions into one-line errors unless debugging."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            raise click.ClickException("interrupted; nothing was written") from None
        except BrokenPipeError:  # e.g. `hf-geonorm architectures | head`
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        except Exception as error:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            raise click.ClickException(
                f"{type(error).__name__}: {first_line(error)} (run with hf-geonorm --debug for the traceback)"
            ) from None


@click.group(cls=GeoNormGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="HF_GEONORM_DEBUG", help="Show tracebacks of unexpected errors.")
@click.version_option(package_name="hf-geonorm", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """GeoNorm (geodesic residual updates on the sphere) for HuggingFace Transformers models.

    \b
    hf-geonorm architectures                 the supported stock model types
    hf-geonorm convert SOURCE OUTPUT_DIR     a checkpoint (folder, .gguf, Hub id) -> GeoNorm folder
    hf-geonorm init ARCH OUTPUT_DIR          a from-scratch GeoNorm config at the paper's sizes
    hf-geonorm info PATH                     what a folder holds
    hf-geonorm angles SOURCE --text FILE     the rotation each residual update makes, per layer
    hf-geonorm perplexity SOURCE --text FILE perplexity on a text
    hf-geonorm train                         train (default: a tiny GeoNorm GPT-2 on the stdlib's source)
    hf-geonorm push PATH REPO_ID             upload a GeoNorm folder to the Hugging Face Hub
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    _quiet_transformers()


def _quiet_transformers() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _stage(step: int, total: int, message: str) -> None:
    click.echo(f"[{step}/{total}] {message}", err=True)


def _settings_line(settings: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items())


def _step_summary(settings: dict[str, Any], num_layers: int, limit: int = 8) -> str:
    from hf_geonorm import step_sizes

    if settings["norm_style"] != "geo":
        return f"(norm_style {settings['norm_style']}: no step sizes)"
    steps = step_sizes(settings["geo_decay"], settings["geo_alpha"], num_layers)
    shown = ", ".join(f"{a:.4g}" for a in steps[:limit])
    return shown + (f", ... ({num_layers} layers, last {steps[-1]:.4g})" if num_layers > limit else "")


def _check_output(output_dir: str, force: bool, source_path: Path | None = None) -> Path:
    output = Path(output_dir).expanduser().absolute()
    if output.exists() and not output.is_dir():
        raise click.ClickException(f"{output_dir} exists and is not a folder")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise click.ClickException(f"{output_dir} exists and is not empty; pass --force to replace it")
    if source_path is not None:
        src = source_path.resolve()
        out = output.resolve()
        if src == out or out in src.parents or src in out.parents:
            raise click.ClickException(
                f"OUTPUT_DIR {output_dir} overlaps the source {source_path}; the source is never modified, "
                "choose another folder"
            )
    return output


# ---- architectures ----


def _layout_value(value: Any) -> Any:
    if callable(value):
        return f"chosen by config ({getattr(value, '__name__', 'function')})"
    return value


def _layout_rows() -> list[dict[str, Any]]:
    import dataclasses

    import hf_geonorm

    rows = []
    for model_type in hf_geonorm.supported_architectures():
        layout = hf_geonorm.family_for(model_type).layout
        row: dict[str, Any] = {"model_type": model_type}
        extras = {}
        for f in dataclasses.fields(layout):
            value = _layout_value(getattr(layout, f.name))
            row[f.name] = value
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.name not in LAYOUT_COLUMNS and f.name not in ("parallel", "parallel_flag") and value != default:
                extras[f.name] = value
        if layout.parallel_flag:
            row["parallel_text"] = f"config.{layout.parallel_flag}"
        elif callable(getattr(layout, "select", None)):
            row["parallel_text"] = ("yes" if layout.parallel else "no") + " (layout chosen by config)"
        else:
            row["parallel_text"] = "yes" if layout.parallel else "no"
        row["extras"] = extras
        rows.append(row)
    return rows


LAYOUT_COLUMNS = ("layers", "attn_norm", "attn", "mlp_norm", "mlp")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def architectures(as_json: bool) -> None:
    """List the supported stock model types and the layout GeoNorm patches: where a decoder layer keeps its
    input norms, attention and MLP, and whether it adds one parallel update. Any checkpoint of these types
    converts; its GeoNorm type is geonorm_<type>."""
    rows = _layout_rows()
    if as_json:
        click.echo(
            json.dumps([{k: v for k, v in row.items() if k != "parallel_text"} for row in rows], indent=2, default=str)
        )
        return
    widths = {"model_type": 20, "layers": 8, "attn_norm": 24, "attn": 16, "mlp_norm": 26, "mlp": 10}
    header = " ".join(f"{name:<{w}}" for name, w in widths.items()) + " parallel"
    click.echo(header)
    click.echo("-" * len(header))
    for row in rows:
        cells = " ".join(f"{str(row[name] if row[name] is not None else '-'):<{w}}" for name, w in widths.items())
        extras = " ".join(f"{k}={v}" for k, v in row["extras"].items())
        click.echo(f"{cells} {row['parallel_text']}" + (f"  [{extras}]" if extras else ""))
    click.echo(f"\n{len(rows)} model types", err=True)


# ---- convert ----


@cli.command()
@click.argument("source")
@click.argument("output_dir", type=click.Path(file_okay=False))
@settings_options
@click.option(
    "--dtype",
    type=click.Choice(DTYPES),
    default="auto",
    show_default=True,
    help="Weight dtype of the output (auto: the source's; GGUF de-quantises to float32).",
)
@click.option("--force", is_flag=True, help="Replace an existing non-empty OUTPUT_DIR.")
@click.option("--base-model", help="Hub id of the model this one derives from, for the model card.")
@click.option("--license", "license_", help="License for the model card (default: the source's, when known).")
@click.option("--repo-id", help="Hub id the folder will be pushed to, used in the card's loading examples.")
@click.option(
    "--eval-text",
    type=click.Path(exists=True, dir_okay=False),
    help="Measure perplexity on this text before and after conversion (printed and put in the card).",
)
@click.option(
    "--eval-tokens", type=click.IntRange(min=2), default=2048, show_default=True, help="Tokens of --eval-text to use."
)
def convert(
    source: str,
    output_dir: str,
    force: bool,
    dtype: str,
    base_model: str | None,
    license_: str | None,
    repo_id: str | None,
    eval_text: str | None,
    eval_tokens: int,
    **kwargs: Any,
) -> None:
    """Convert SOURCE to a GeoNorm checkpoint in OUTPUT_DIR.

    SOURCE is a local checkpoint folder, a .gguf file, or a Hugging Face Hub model id. OUTPUT_DIR gets
    safetensors weights, a config with model_type geonorm_<type> and the settings, the tokenizer (when the
    source has one), the modelling source with auto_map (so it loads with trust_remote_code=True where
    hf-geonorm is not installed) and a README.md model card. The source is never modified; the output is
    written to a temporary folder and moved into place when complete.

    With --bridge 0 the converted model computes exactly what the source does; --bridge 1 (the default) is
    pure GeoNorm.
    """
    given = pop_settings(kwargs)
    _check_output(output_dir, force)
    total = 5 if eval_text else 4
    _stage(1, total, f"reading {source}")
    src = resolve_source(source)
    _check_output(output_dir, force, src.path)
    current = _current_settings(src)
    settings = check_settings(given, current, src.num_layers)

    from hf_geonorm.export import CardInfo, atomic_directory, save_with_remote_code

    started = time.perf_counter()
    try:
        with atomic_directory(output_dir, force=force) as tmp:
            _stage(2, total, f"loading the {src.model_type} model ({src.kind})")
            model = load_model(src, dtype)
            tokenizer = load_tokenizer(src)
            evaluation = []
            token_windows = None
            if eval_text:
                from .measure import perplexity, prepare

                token_windows, how = prepare(model, tokenizer, eval_text, eval_tokens, None)
                _stage(3, total, f"perplexity of the source on {Path(eval_text).name}")
                before = perplexity(model, token_windows, "source perplexity")
            _stage(total - 1, total, f"converting to geonorm_{src.stock_type}: {_settings_line(settings)}")
            apply_settings(model, settings)
            if token_windows is not None:
                after = perplexity(model, token_windows, "converted perplexity")
                tokens = sum(len(w) for w in token_windows)
                line = (
                    f"perplexity on {Path(eval_text).name} ({tokens} tokens, {how}): {before:.4f} before conversion "
                    f"(source), {after:.4f} after (this model)"
                )
                evaluation.append(line)
                click.echo(f"source perplexity: {before:.4f}\nconverted perplexity: {after:.4f}")
            metadata = card_metadata(src)
            info = CardInfo(
                base_model=base_model or metadata.get("base_model"),
                license=license_ or metadata.get("license"),
                language=metadata.get("language"),
                source=source if src.kind == "hub" else Path(source).name,
                repo_id=repo_id,
                evaluation=evaluation,
            )
            _stage(total, total, f"writing {output_dir}")
            save_with_remote_code(model, tmp, tokenizer=tokenizer, card_info=info)
    except FileExistsError as error:
        raise click.ClickException(str(error)) from None
    except OSError as error:
        raise click.ClickException(f"cannot write {output_dir}: {error.strerror or first_line(error)}") from None
    files = sorted(p.name for p in Path(output_dir).iterdir())
    click.echo(f"wrote {output_dir} in {time.perf_counter() - started:.1f}s: {', '.join(files)}")
    click.echo(f"model_type geonorm_{src.stock_type}; {_settings_line(settings)}")
    click.echo(f"step sizes: {_step_summary(settings, src.num_layers)}")


def _current_settings(src: Source) -> dict[str, Any] | None:
    """The settings of a GeoNorm source (the defaults fill in for a stock one)."""
    if not src.is_geonorm:
        return None
    from hf_geonorm import GeoNormSettings

    names = GeoNormSettings.names()
    return {k: v for k, v in src.config.items() if k in names}


# ---- init ----


def _count_parameters_meta(config: Any, check_forward: bool = False) -> int:
    """Parameters of the model ``config`` describes, built on the meta device (no memory); with
    ``check_forward`` also run a few tokens through it there, which finds sizes that do not fit together."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        # eager experts: an MoE forward then raises NotImplementedError on meta (below) whatever kernel an earlier
        # real MoE model in this process made transformers choose (grouped_mm on meta demands bfloat16)
        model = AutoModelForCausalLM.from_config(config, experts_implementation="eager")
        if check_forward:
            try:
                model(torch.ones((1, 4), dtype=torch.long))
            except NotImplementedError:  # data-dependent ops (MoE routing) cannot run on meta: not checked
                pass
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@cli.command()
@click.argument("arch")
@click.argument("output_dir", type=click.Path(file_okay=False))
@click.option(
    "--preset",
    type=click.Choice(PRESETS),
    help="Model size: the paper's 125m (12 layers, width 768, 12 heads), 350m (24/1024/16), "
    "760m (24/1536/16), 1.3b (24/2048/32); tiny is 4/128/4.",
)
@settings_options
@click.option(
    "--tokenizer", "tokenizer_path", help="Tokenizer folder or Hub id; sets the vocabulary and special tokens."
)
@click.option(
    "--vocab-size",
    type=click.IntRange(min=1),
    help=f"Vocabulary size [default: the tokenizer's, rounded up to 64; else {DEFAULT_VOCAB}].",
)
@click.option("--max-length", type=click.IntRange(min=1), help="max_position_embeddings [default: 2048; 256 for tiny].")
@click.option(
    "--tie-embeddings/--no-tie-embeddings",
    default=True,
    show_default=True,
    help="Share the input embedding and the output head (as the paper's GPT-3-shaped models count).",
)
@click.option("--force", is_flag=True, help="Replace an existing non-empty OUTPUT_DIR.")
def init(
    arch: str,
    output_dir: str,
    preset: str,
    tokenizer_path: str | None,
    vocab_size: int | None,
    max_length: int | None,
    tie_embeddings: bool,
    force: bool,
    **kwargs: Any,
) -> None:
    """Write a from-scratch GeoNorm config for architecture ARCH (a stock model type such as llama or gpt2)
    to OUTPUT_DIR, for pretraining.

    OUTPUT_DIR gets config.json (model_type geonorm_ARCH, with auto_map and the modelling source) and the
    tokenizer when --tokenizer is given. Build the model with
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(OUTPUT_DIR)) after `import hf_geonorm`.
    """
    if preset is None:
        raise click.UsageError(f"--preset is required: one of {', '.join(PRESETS)}")
    given = pop_settings(kwargs)
    _check_output(output_dir, force)
    check_supported(arch)
    import hf_geonorm
    from hf_geonorm.presets import fit_token_ids, preset_sizes

    family = hf_geonorm.family_for(arch)
    try:
        values = preset_sizes(family.config_class, preset, max_length)
    except Exception as error:  # noqa: BLE001 - a config class that cannot be read generically
        raise click.ClickException(
            f"init cannot size a {arch} config generically ({type(error).__name__}: {first_line(error)}); build one "
            "with transformers and convert it"
        ) from None
    settings = check_settings(given, None, values["num_hidden_layers"])
    tokenizer = None
    if tokenizer_path:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        except Exception as error:  # noqa: BLE001 - reported in one line
            raise click.ClickException(f"cannot load the tokenizer {tokenizer_path}: {first_line(error)}") from None
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            token_id = getattr(tokenizer, name, None)
            if isinstance(token_id, int):
                values[name] = token_id
    if vocab_size is None:
        vocab_size = int(math.ceil(len(tokenizer) / 64) * 64) if tokenizer is not None else DEFAULT_VOCAB
    elif tokenizer is not None and vocab_size < len(tokenizer):
        raise click.UsageError(f"--vocab-size {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens")
    values["vocab_size"] = vocab_size
    values["tie_word_embeddings"] = tie_embeddings
    fit_token_ids(values, family.config_class)
    try:
        config = family.config_class(**values, **settings)
        n_params = _count_parameters_meta(config, check_forward=True)
    except Exception as error:  # noqa: BLE001 - any failure means the preset does not fit this architecture
        raise click.ClickException(
            f"the {preset} preset does not fit {arch} ({type(error).__name__}: {first_line(error)}); build a config "
            "of your own with transformers and convert it, or choose another architecture"
        ) from None
    from hf_geonorm.export import atomic_directory, save_config_with_remote_code

    try:
        with atomic_directory(output_dir, force=force) as tmp:
            save_config_with_remote_code(config, tmp, tokenizer=tokenizer)
    except OSError as error:
        raise click.ClickException(f"cannot write {output_dir}: {error.strerror or first_line(error)}") from None
    click.echo(
        f"wrote {output_dir}: geonorm_{family.stock_type}, preset {preset}: {values['num_hidden_layers']} layers, "
        f"width {values['hidden_size']}, {values['num_attention_heads']} heads, vocabulary {vocab_size}, "
        f"{n_params / 1e6:.1f}M parameters"
    )
    click.echo(_settings_line(settings))
    click.echo(f"step sizes: {_step_summary(settings, values['num_hidden_layers'])}")


# ---- info ----


def _info(path: Path) -> dict[str, Any]:
    import hf_geonorm
    from hf_geonorm.export import check_remote_code, saved_parameter_count

    config = read_config_json(path, str(path))
    model_type = config["model_type"]
    check_supported(model_type)
    family = hf_geonorm.family_for(model_type)
    geonorm = model_type.startswith("geonorm_")
    num_layers = Source(str(path), "folder", str(path), None, config, path).num_layers
    out: dict[str, Any] = {
        "path": str(path),
        "model_type": model_type,
        "family": family.stock_type,
        "geonorm": geonorm,
        "architectures": config.get("architectures"),
        "num_layers": num_layers,
        "hidden_size": config.get("hidden_size", config.get("n_embd")),
        "vocab_size": config.get("vocab_size"),
        "dtype": config.get("dtype", config.get("torch_dtype")),
    }
    try:
        counted = saved_parameter_count(path)
    except (OSError, ValueError, KeyError) as error:
        raise click.ClickException(f"{path}: the safetensors weights are corrupt ({first_line(error)})") from None
    if counted is not None:
        out["parameters"], out["parameters_by_dtype"] = counted
        out["parameters_from"] = "safetensors header"
    else:
        try:
            cfg = family.config_class.from_dict(config) if geonorm else family.stock_config_class.from_dict(config)
            out["parameters"] = _count_parameters_meta(cfg)
            out["parameters_from"] = "config (no weights in the folder)"
        except Exception:  # noqa: BLE001 - size unknown is fine for info
            out["parameters"] = None
    if geonorm:
        settings = check_settings(
            {}, {k: v for k, v in config.items() if k in hf_geonorm.GeoNormSettings.names()}, num_layers
        )
        out["settings"] = settings
        if settings["norm_style"] == "geo":
            out["step_sizes"] = hf_geonorm.step_sizes(settings["geo_decay"], settings["geo_alpha"], num_layers)
    status = check_remote_code(path, config)
    out["remote_code"] = {
        "auto_map": status.auto_map,
        "files": status.files,
        "missing": status.missing,
        "complete": status.complete,
    }
    readme = path / "README.md"
    out["model_card"] = None
    if readme.is_file():
        card: dict[str, Any] = {"file": "README.md"}
        try:
            from huggingface_hub import ModelCard

            data = ModelCard.load(readme).data.to_dict()
            card.update({k: data.get(k) for k in ("base_model", "license", "tags", "pipeline_tag", "library_name")})
        except Exception as error:  # noqa: BLE001 - a card without valid metadata is still reported
            card["error"] = first_line(error)
        out["model_card"] = card
    out["tokenizer"] = any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    return out


@cli.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info(path: str, as_json: bool) -> None:
    """Describe the checkpoint folder PATH: family, size, GeoNorm settings, per-layer step sizes, and
    whether remote code and a model card are present. Reads headers only; loads no weights."""
    data = _info(Path(path))
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    kind = (
        f"{data['model_type']} (GeoNorm, stock family {data['family']})"
        if data["geonorm"]
        else (f"{data['model_type']} (stock Pre-Norm; convert it with hf-geonorm convert)")
    )
    click.echo(f"path:         {data['path']}")
    click.echo(f"model type:   {kind}")
    click.echo(
        f"size:         {data['num_layers']} layers, hidden size {data['hidden_size']}, vocabulary {data['vocab_size']}"
    )
    if data.get("parameters") is not None:
        by = data.get("parameters_by_dtype")
        dtypes = f", {', '.join(f'{k}: {v:,}' for k, v in by.items())}" if by else ""
        click.echo(f"parameters:   {data['parameters']:,} ({data['parameters_from']}{dtypes})")
    if data["geonorm"]:
        click.echo(f"settings:     {_settings_line(data['settings'])}")
        if "step_sizes" in data:
            steps = ", ".join(f"{k}: {a:.4g}" for k, a in enumerate(data["step_sizes"], start=1))
            click.echo(f"step sizes:   {steps}")
    rc = data["remote_code"]
    if rc["complete"]:
        click.echo(f"remote code:  yes ({', '.join(rc['files'])}; auto_map {', '.join(rc['auto_map'])})")
    elif rc["auto_map"]:
        click.echo(f"remote code:  BROKEN (auto_map points at missing {', '.join(rc['missing'])})")
    else:
        click.echo("remote code:  no (loads only where hf-geonorm is installed and imported)")
    card = data["model_card"]
    if card is None:
        click.echo("model card:   no")
    elif "error" in card:
        click.echo(f"model card:   README.md (metadata unreadable: {card['error']})")
    else:
        details = ", ".join(f"{k} {v}" for k, v in card.items() if k != "file" and v)
        click.echo(f"model card:   yes ({details})")
    click.echo(f"tokenizer:    {'yes' if data['tokenizer'] else 'no'}")


# ---- angles and perplexity ----


def _model_for_measuring(source: str, dtype: str, device: str, given: dict[str, Any]) -> tuple[Any, Any, Source]:
    src = resolve_source(source)
    settings = check_settings(given, _current_settings(src), src.num_layers) if given else None
    model = load_model(src, dtype)
    tokenizer = load_tokenizer(src)
    if settings is not None:
        apply_settings(model, settings)
    elif not src.is_geonorm:
        apply_settings(model, {"norm_style": "pre"})  # the stock computation, with residual modules to hook
    try:
        model.to(device)
    except (RuntimeError, AssertionError) as error:
        raise click.ClickException(f"cannot use device {device!r}: {first_line(error)}") from None
    return model, tokenizer, src


text_option = click.option(
    "--text",
    "text_path",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="A UTF-8 text file to run the model on.",
)
tokens_option = click.option(
    "--max-tokens", type=click.IntRange(min=2), default=1024, show_default=True, help="Tokens of the text to use."
)
window_option = click.option(
    "--window",
    type=click.IntRange(min=2),
    help="Tokens per forward pass [default: the model's context, at most --max-tokens].",
)
dtype_option = click.option(
    "--dtype", type=click.Choice(DTYPES), default="float32", show_default=True, help="Dtype to run the model in."
)
device_option = click.option("--device", default="cpu", show_default=True, help="torch device to run on.")


@cli.command()
@click.argument("source")
@text_option
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also draw the angles into this PNG.")
@tokens_option
@window_option
@dtype_option
@device_option
@preview_settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def angles(
    source: str,
    text_path: str,
    plot_path: str | None,
    max_tokens: int,
    window: int | None,
    dtype: str,
    device: str,
    as_json: bool,
    **kwargs: Any,
) -> None:
    """Measure, per layer and sublayer, the rotation angle each residual update makes on the sphere while
    SOURCE (folder, .gguf or Hub id) reads the text.

    For a Pre-Norm model (a stock checkpoint, norm_style pre, or geo with --bridge 0) these are its implicit
    angles, the angle between h and h + u, and its implied step sizes 1/s_k with s_k = |h_k|/sqrt(d): the
    depth-dependent angles that make Pre-Norm a special case of GeoNorm. For a GeoNorm model they are the
    angles its geodesic steps actually make, next to its step sizes a_k. Settings options convert SOURCE in
    memory first (to preview a conversion). Angles are means over all tokens, in radians.
    """
    from .measure import check_plot_target, depth_summary, format_table, measure_angles, plot, prepare, regime

    given = pop_settings(kwargs)
    if plot_path:
        check_plot_target(plot_path)
    model, tokenizer, src = _model_for_measuring(source, dtype, device, given)
    token_windows, how = prepare(model, tokenizer, text_path, max_tokens, window)
    if tokenizer is None:
        click.echo(f"note: {source} has no tokenizer; using {how}", err=True)
    stats = measure_angles(model, token_windows)
    mode = regime(model.config)
    prenorm = mode == "pre-norm"
    summary = depth_summary(stats)
    tokens = sum(len(w) for w in token_windows)
    label = f"{Path(source).name if src.kind != 'hub' else source} on {Path(text_path).name}"
    if plot_path:
        kind = "Pre-Norm implicit angles" if prenorm else f"{mode} angles"
        plot(stats, prenorm, plot_path, f"{kind}: {label}")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "source": source,
                    "source_model_type": src.model_type,
                    "model_type": model.config.model_type,
                    "regime": mode,
                    "tokens": tokens,
                    "tokenization": how,
                    "settings": _model_settings(model),
                    "summary": summary,
                    "sublayers": [s.to_dict() for s in stats],
                },
                indent=2,
            )
        )
        return
    if prenorm:
        what = f"stock {src.model_type}" if not src.is_geonorm else model.config.model_type
        click.echo(f"{label}: Pre-Norm ({what}), {tokens} tokens ({how})")
        click.echo("angle = the rotation of h -> h + u on the sphere; 1/s = the implied step size, s = |h|/sqrt(d)")
    else:
        click.echo(
            f"{label}: {mode} ({model.config.model_type}; {_settings_line(_model_settings(model))}), "
            f"{tokens} tokens ({how})"
        )
        click.echo("angle = the rotation each update actually makes; a_k = the configured step size")
    click.echo(format_table(stats, prenorm))
    click.echo(
        f"mean angle, lowest third of the layers: {summary['lower_third_mean_angle']:.4f} rad; highest third: "
        f"{summary['upper_third_mean_angle']:.4f} rad (ratio {summary['lower_to_upper_ratio']:.2f})"
    )
    if plot_path:
        click.echo(f"plot: {plot_path}")


def _model_settings(model: Any) -> dict[str, Any]:
    from hf_geonorm import GeoNormSettings

    return GeoNormSettings.from_object(model.config).to_dict()


@cli.command()
@click.argument("source")
@text_option
@tokens_option
@window_option
@dtype_option
@device_option
@preview_settings_options
def perplexity(
    source: str, text_path: str, max_tokens: int, window: int | None, dtype: str, device: str, **kwargs: Any
) -> None:
    """Perplexity of SOURCE (folder, .gguf or Hub id) on a text, over non-overlapping windows. Settings
    options convert SOURCE in memory first."""
    from .measure import perplexity as measure_perplexity
    from .measure import prepare

    given = pop_settings(kwargs)
    model, tokenizer, _ = _model_for_measuring(source, dtype, device, given)
    token_windows, how = prepare(model, tokenizer, text_path, max_tokens, window)
    value = measure_perplexity(model, token_windows)
    tokens = sum(len(w) for w in token_windows)
    click.echo(f"perplexity: {value:.6g} ({tokens} tokens in {len(token_windows)} windows, {how})")


cli.add_command(train)
cli.add_command(push)


def main() -> None:  # pragma: no cover - the console script calls cli()
    cli(prog_name="hf-geonorm")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
