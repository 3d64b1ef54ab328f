"""``hf-geonorm``: convert checkpoints to GeoNorm, create from-scratch configs, inspect folders, measure angles.

Each command parses its options, makes one call into the library (``hf_geonorm.conversion.convert``,
``.training.run.model``, ``.conversion.inspection``, ``.analysis.evaluation``, ``.analysis.angles``,
``.training.run.trainer``, ``.sharing.hub``) and prints the result. User mistakes end
in a one-line ``Error: ...`` and a non-zero exit (``errors.GeoNormGroup``); ``--debug`` (or HF_GEONORM_DEBUG=1)
shows the traceback of unexpected errors instead.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from .card import card, check_card_options
from .command_options import (
    PRESET_NAMES,
    AngleMeasuringOptions,
    ConversionOptions,
    GroupOptions,
    InitOptions,
    MeasuringOptions,
    PlotOptions,
    TableOptions,
)
from .errors import GeoNormGroup, cannot_write
from .info import info
from .info import settings_line as _settings_line
from .options import options_from, pop_settings, preview_settings_options, settings_options
from .push import push
from .sweep import sweep
from .train import train

PRESETS = PRESET_NAMES


@click.group(cls=GeoNormGroup, context_settings={"help_option_names": ["-h", "--help"]})
@options_from(GroupOptions)
@click.version_option(package_name="hf-geonorm", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """GeoNorm (geodesic residual updates on the sphere) for HuggingFace Transformers models.

    \b
    hf-geonorm architectures                 the supported stock model types
    hf-geonorm convert SOURCE OUTPUT_DIR     a checkpoint (folder, .gguf, Hub id) -> GeoNorm folder
    hf-geonorm init ARCH OUTPUT_DIR          a from-scratch GeoNorm config at the paper's sizes
    hf-geonorm info PATH                     what a folder (or .gguf file) holds
    hf-geonorm card PATH                     write the GeoNorm card of a folder another tool saved
    hf-geonorm angles SOURCE --text FILE     the rotation each residual update makes, per layer
    hf-geonorm perplexity SOURCE --text FILE perplexity on a text
    hf-geonorm train                         train (default: a tiny GeoNorm GPT-2 on the stdlib's source)
    hf-geonorm sweep --styles pre,geo        which style and learning rate train best on your data
    hf-geonorm push PATH REPO_ID             upload a GeoNorm folder to the Hugging Face Hub
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # the library reports what matters itself


def _progress(line: str) -> None:
    click.echo(line, err=True)


def _step_summary(settings: dict[str, Any], num_layers: int, limit: int = 8) -> str:
    from hf_geonorm.modeling.geometry import step_sizes, updates_per_layer

    if settings["norm_style"] != "geo":
        return f"(norm_style {settings['norm_style']}: no step sizes)"
    per = updates_per_layer(settings["geo_alpha"], num_layers)
    steps = step_sizes(settings["geo_decay"], settings["geo_alpha"], num_layers, per)
    shown = ", ".join(f"{a:.4g}" for a in steps[:limit])
    unit = f"{num_layers} layers" if per == 1 else f"{len(steps)} updates, {per} per layer"
    return shown + (f", ... ({unit}, last {steps[-1]:.4g})" if len(steps) > limit else "")


# ---- architectures ----


@cli.command()
@options_from(TableOptions)
def architectures(as_json: bool) -> None:
    """List the supported stock model types and the layout GeoNorm patches: where a decoder layer keeps its
    input norms, attention and MLP, and whether it adds one parallel update. Any checkpoint of these types
    converts; its GeoNorm type is geonorm_<type>."""
    from hf_geonorm.conversion.inspection import architecture_rows

    rows = architecture_rows()
    if as_json:
        rows = [{k: v for k, v in row.items() if k != "parallel_text"} for row in rows]
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    widths = {"model_type": 20, "layers": 8, "attn_norm": 24, "attn": 16, "mlp_norm": 26, "mlp": 10}
    header = " ".join(f"{name:<{w}}" for name, w in widths.items()) + " parallel"
    click.echo(header + "\n" + "-" * len(header))
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
@options_from(ConversionOptions)
def convert(source: str, output_dir: str, **kwargs: Any) -> None:
    """Convert SOURCE to a GeoNorm checkpoint in OUTPUT_DIR.

    SOURCE is a local checkpoint folder, a .gguf file, or a Hugging Face Hub model id. OUTPUT_DIR gets
    safetensors weights, a config with model_type geonorm_<type> and the settings, the tokenizer (when the
    source has one), the modelling source with auto_map (so it loads with trust_remote_code=True where
    hf-geonorm is not installed) and a README.md model card. The source is never modified; the output is
    written to a temporary folder and moved into place when complete.

    With --bridge 0 the converted model computes exactly what the source does; --bridge 1 (the default) is
    pure GeoNorm.
    """
    from hf_geonorm.conversion.convert import convert_checkpoint

    settings = pop_settings(kwargs)
    options = ConversionOptions(**kwargs)
    if options.license == "other":
        raise click.UsageError(
            "--license other needs a license name, which convert does not take: convert without --license, then "
            f"hf-geonorm card {output_dir} --license other --license-name NAME"
        )
    check_card_options(options.license, None, options.base_model, "the card names SOURCE, a local folder, by itself")
    try:
        result = convert_checkpoint(source, output_dir, settings, options, progress=_progress)
    except OSError as error:
        raise cannot_write(output_dir, error) from None
    if result.perplexity_before is not None:
        click.echo(f"source perplexity: {result.perplexity_before:.4f}")
        click.echo(f"converted perplexity: {result.perplexity_after:.4f}")
    click.echo(f"wrote {output_dir} in {result.seconds:.1f}s: {', '.join(result.files)}")
    click.echo(f"model_type {result.model_type}; {_settings_line(result.settings)}")
    click.echo(f"step sizes: {_step_summary(result.settings, result.num_layers)}")


# ---- init ----


@cli.command()
@click.argument("arch")
@click.argument("output_dir", type=click.Path(file_okay=False))
@options_from(InitOptions)
@settings_options
def init(arch: str, output_dir: str, preset: str | None, **kwargs: Any) -> None:
    """Write a from-scratch GeoNorm config for architecture ARCH (a stock model type such as llama or gpt2)
    to OUTPUT_DIR, for pretraining.

    OUTPUT_DIR gets config.json (model_type geonorm_ARCH, with auto_map and the modelling source) and the
    tokenizer when --tokenizer is given. Build the model with
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(OUTPUT_DIR)) after `import hf_geonorm`.
    """
    if preset is None:
        raise click.UsageError(f"--preset is required: one of {', '.join(PRESETS)}")
    from hf_geonorm.training.run.model import write_scratch_config

    try:
        result = write_scratch_config(arch, output_dir, preset, pop_settings(kwargs), **kwargs)
    except OSError as error:
        raise cannot_write(output_dir, error) from None
    config, layers = result.config, result.config.num_hidden_layers
    click.echo(
        f"wrote {output_dir}: {config.model_type}, preset {preset}: {layers} layers, width {config.hidden_size}, "
        f"{config.num_attention_heads} heads, vocabulary {config.vocab_size}, {result.parameters / 1e6:.1f}M parameters"
    )
    click.echo(_settings_line(result.settings))
    click.echo(f"step sizes: {_step_summary(result.settings, layers)}")


# ---- angles and perplexity ----


@cli.command()
@click.argument("source")
@options_from(PlotOptions, TableOptions, AngleMeasuringOptions)
@preview_settings_options
def angles(source: str, text_path: str, plot_path: str | None, as_json: bool, max_tokens: int, window: int | None,
           dtype: str, device: str, allow_missing: bool, **kwargs: Any) -> None:  # fmt: skip
    """Measure, per layer and sublayer, the rotation angle each residual update makes on the sphere while
    SOURCE (folder, .gguf or Hub id) reads the text.

    For a Pre-Norm model (a stock checkpoint, norm_style pre, or geo with --bridge 0) these are its implicit
    angles, the angle between h and h + u, and its implied step sizes 1/s_k with s_k = |h_k|/sqrt(d): the
    depth-dependent angles that make Pre-Norm a special case of GeoNorm. For a GeoNorm model they are the
    angles its geodesic steps actually make, next to its step sizes a_k. Settings options convert SOURCE in
    memory first (to preview a conversion). Angles are means over all tokens, in radians.
    """
    from hf_geonorm.analysis.angles import analyse_angles, angles_table, clamp_reading
    from hf_geonorm.analysis.evaluation import BYTES_TOKENIZATION

    report = analyse_angles(source, text_path, max_tokens, window, dtype, device, pop_settings(kwargs), plot_path,
                            allow_missing)  # fmt: skip
    if report.tokenization == BYTES_TOKENIZATION:
        click.echo(f"note: {source} has no tokenizer; using {report.tokenization}", err=True)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    label = f"{report.source.label} on {report.text}"
    if report.prenorm:
        what = f"stock {report.source.model_type}" if not report.source.is_geonorm else report.model_type
        click.echo(f"{label}: Pre-Norm ({what}), {report.tokens} tokens ({report.tokenization})")
        click.echo("angle = the rotation of h -> h + u on the sphere; 1/s = the implied step size, s = |h|/sqrt(d)")
    else:
        click.echo(f"{label}: {report.regime} ({report.model_type}; {_settings_line(report.settings)}), "
                   f"{report.tokens} tokens ({report.tokenization})")  # fmt: skip
        click.echo("angle = the rotation each update actually makes; a_k = the configured step size")
    click.echo(angles_table(report.sublayers, report.prenorm))
    summary = report.summary
    click.echo(
        f"mean angle, lowest third of the layers: {summary['lower_third_mean_angle']:.4f} rad; highest third: "
        f"{summary['upper_third_mean_angle']:.4f} rad (ratio {summary['lower_to_upper_ratio']:.2f})"
    )
    if summary["at_clamp_share"] is not None:
        click.echo(f"at the clamp: {clamp_reading(summary['at_clamp_share'], report.settings['geo_max_angle'])}")
    if plot_path:
        click.echo(f"plot: {plot_path}")


@cli.command()
@click.argument("source")
@options_from(MeasuringOptions)
@preview_settings_options
def perplexity(source: str, text_path: str, max_tokens: int, window: int | None, dtype: str, device: str,
               allow_missing: bool, **kwargs: Any) -> None:  # fmt: skip
    """Perplexity of SOURCE (folder, .gguf or Hub id) on a text, over non-overlapping windows. Settings
    options convert SOURCE in memory first. A perplexity that is not finite is an error that says where the
    first non-finite value appeared and which setting or dtype made it."""
    from hf_geonorm.analysis.evaluation import measure_perplexity

    report = measure_perplexity(source, text_path, max_tokens, window, dtype, device, pop_settings(kwargs),
                                allow_missing, log=_progress)  # fmt: skip
    click.echo(f"perplexity: {report.perplexity:.6g} ({report.tokens} tokens in {report.windows} windows, "
               f"{report.tokenization})")  # fmt: skip


cli.add_command(card)
cli.add_command(info)
cli.add_command(train)
cli.add_command(sweep)
cli.add_command(push)


def main() -> None:  # pragma: no cover - the console script calls cli()
    cli(prog_name="hf-geonorm")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
