"""``hf-geonorm info``: what a checkpoint folder or ``.gguf`` file holds, and the summary of a ``train`` or
``sweep`` output folder (``hf_geonorm.conversion.inspection.describe``, ``hf_geonorm.training.run.summary``,
``hf_geonorm.sweep.summary``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from hf_geonorm.sharing.gguf_lineage import header_description

from .command_options import JSONOptions
from .options import options_from


def settings_line(settings: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items())


def _positions_line(data: dict[str, Any]) -> str:
    positions = data.get("positions")
    if positions is None:
        return "not stated in the config"
    return (f"{positions:,} (the longest prompt plus generated tokens; hf-geonorm init --max-length sets it, and "
            "train --arch gives its preset's, or --seq-len when longer)")  # fmt: skip


@click.command()
@click.argument("path", type=click.Path(exists=True))
@options_from(JSONOptions)
def info(path: str, as_json: bool) -> None:
    """Describe the checkpoint folder (or .gguf file) PATH: family, size, positions, GeoNorm settings, per-layer
    step sizes, and whether remote code and a model card are present. Reads headers only; loads no weights.

    On the output folder of `train` it summarises the run (its model, steps, tokens, learning rate and where it came
    from, losses; an unfinished run from its newest checkpoint), and on that of `sweep` the sweep (its arms, each
    arm's best rate, the arm lowest on test and by how much, and where the report is)."""
    data = _gguf_header_facts(path)
    if data is None:
        from hf_geonorm.conversion.inspection import describe
        from hf_geonorm.sweep.summary import describe_sweep, is_sweep_folder
        from hf_geonorm.training.run.summary import describe_run, is_run_folder

        folder = Path(path)
        if folder.is_dir() and is_sweep_folder(folder):
            data = describe_sweep(folder)
        elif folder.is_dir() and is_run_folder(folder):
            data = describe_run(folder)
        else:
            data = describe(path)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    {"gguf": _gguf, "run": _run, "sweep": _sweep}.get(data.get("kind", ""), _folder)(path, data)


def _gguf_header_facts(path: str) -> dict[str, Any] | None:
    """A ``.gguf`` file's facts from its header alone, without importing torch or transformers
    (``hf_geonorm.sharing.gguf_lineage``); None for anything else, or where the header does not settle them."""
    if Path(path).suffix.lower() != ".gguf" or not Path(path).is_file():
        return None
    return header_description(path)


def _gguf(path: str, data: dict[str, Any]) -> None:
    click.echo(f"path:         {data['path']} (GGUF)\nmodel type:   {data['model_type']} (stock Pre-Norm; "
               f"convert it with hf-geonorm convert {path} OUTPUT_DIR)")  # fmt: skip
    click.echo(f"size:         {data['num_layers']} layers, hidden size {data['hidden_size']}, vocabulary "
               f"{data['vocab_size']}")  # fmt: skip
    click.echo(f"positions:    {_positions_line(data)}")
    if data["parameters"] is not None:
        click.echo(f"parameters:   {data['parameters']:,} ({data['parameters_from']})")
    metadata = dict(data["metadata"])
    types = metadata.pop("source_tensor_types", None)
    if "source_model" in metadata:
        click.echo(f"model name:   {metadata.pop('source_model')} (as the file names it)")
    facts = ", ".join(f"{k} {v}" for k, v in metadata.items())
    click.echo(f"metadata:     {facts or 'no license, base model or language'}")
    if types:
        click.echo(f"tensors:      {', '.join(f'{kind} {count}' for kind, count in types.items())} (convert "
                   "de-quantises them to float32)")  # fmt: skip


def _folder(path: str, data: dict[str, Any]) -> None:
    from hf_geonorm.checkpoints.loading import PICKLE_ADVICE

    if data["geonorm"]:
        family = f"GeoNorm, stock family {data['family']}"
    else:
        family = "stock Pre-Norm; convert it with hf-geonorm convert"
    click.echo(f"path:         {data['path']}\nmodel type:   {data['model_type']} ({family})")
    click.echo(
        f"size:         {data['num_layers']} layers, hidden size {data['hidden_size']}, vocabulary {data['vocab_size']}"
    )
    click.echo(f"positions:    {_positions_line(data)}")
    if data.get("parameters") is not None:
        by = data.get("parameters_by_dtype")
        dtypes = f", {', '.join(f'{k}: {v:,}' for k, v in by.items())}" if by else ""
        click.echo(f"parameters:   {data['parameters']:,} ({data['parameters_from']}{dtypes})")
    if data["pickle_weights"]:
        names = data["pickle_weights"]
        what = f"{names[0]} is a pickle" if len(names) == 1 else f"{', '.join(names)} are pickles"
        click.echo(f"weights:      {what}; {PICKLE_ADVICE}")
    if data["geonorm"]:
        click.echo(f"settings:     {settings_line(data['settings'])}")
        if "step_sizes" in data:
            steps = list(enumerate(data["step_sizes"], start=1))
            shown = steps if len(steps) <= 16 else [*steps[:8], None, steps[-1]]  # a deep config: its first and last
            click.echo("step sizes:   " + ", ".join("..." if s is None else f"{s[0]}: {s[1]:.4g}" for s in shown))
    rc = data["remote_code"]
    if rc["complete"]:
        click.echo(f"remote code:  yes ({', '.join(rc['files'])}; auto_map {', '.join(rc['auto_map'])})")
    elif rc["auto_map"]:
        click.echo(f"remote code:  BROKEN (auto_map points at missing {', '.join(rc['missing'])})")
    else:
        click.echo("remote code:  no (loads only where hf-geonorm is installed and imported)")
    card = data["model_card"]
    write_one = f"write one with hf-geonorm card {path}"
    if card is None:
        click.echo(f"model card:   no{f' ({write_one})' if data['geonorm'] else ''}")
    elif "error" in card:
        click.echo(f"model card:   README.md (metadata unreadable: {card['error']})")
    elif data["geonorm"] and "geonorm" not in (card.get("tags") or []):
        click.echo(f"model card:   README.md, not a GeoNorm card (another tool's; push refuses it): {write_one}")
    else:
        click.echo(f"model card:   yes ({', '.join(f'{k} {v}' for k, v in card.items() if k != 'file' and v)})")
    click.echo(f"tokenizer:    {'yes' if data['tokenizer'] else 'no'}")


def _run(path: str, data: dict[str, Any]) -> None:
    if data["finished"]:
        state = "finished"
    else:
        state = f"unfinished: `hf-geonorm train` with its options and --output {path} --resume continues it"
    click.echo(f"path:         {data['path']} (a `train` output folder; {state})")
    model = data["model"]
    if model is None:
        click.echo("model:        none yet (no checkpoint was written)")
    else:
        size = f"; {data['model_type']}, {data['parameters']:,} parameters" if data.get("parameters") else ""
        click.echo(f"model:        {model} (hf-geonorm info {model} describes it{size})")
    if data.get("steps") is not None:
        tokens = f", {data['tokens']:,} tokens ({data['tokens_per_step']:,} a step)" if data.get("tokens") else ""
        click.echo(f"steps:        {data['steps']:,} of {data['max_steps']:,}{tokens}")
    rate = data.get("learning_rate")
    if rate is not None:
        click.echo(f"learning rate: {rate['value']:g} ({rate['why']})")
    losses = []
    if data.get("validation_loss") is not None:
        at = " (final)" if data["finished"] else f" at step {data['validation_step']}"
        losses.append(f"validation loss {data['validation_loss']:.4f}{at}")
    if data.get("test_loss") is not None:
        losses.append(f"test loss {data['test_loss']:.4f}")
    if data.get("training_loss") is not None:
        losses.append(f"training loss {data['training_loss']:.4f} (the last logged)")
    click.echo(f"losses:       {'; '.join(losses) or 'none logged yet'}")
    written = [name for name in ("metrics", "loss_curve") if data.get(name)]
    files = [data[name] for name in written] + [f"{name}/" for name in data["checkpoints"]]
    click.echo(f"files:        {', '.join(files) or 'none'}")


def _sweep(path: str, data: dict[str, Any]) -> None:
    click.echo(f"path:         {data['path']} (a `sweep` output folder: {data['runs']} finished runs in "
               f"{data['journal']})")  # fmt: skip
    for number, caveat in enumerate(data.get("caveats", [])):
        click.echo(f"{'caveat:       ' if number == 0 else ' ' * 14}{caveat.replace('**', '')}")
    if not data["arms"]:
        click.echo("arms:         none yet (no run has finished)")
    for number, arm in enumerate(data["arms"]):
        losses = "every run at it diverged" if arm["validation_loss"] is None else (
            f"validation loss {arm['validation_loss']:.4f}, test loss {arm['test_loss']:.4f}")  # fmt: skip
        label = "arms:         " if number == 0 else " " * 14
        share = arm.get("warmup_share")
        warmup = "" if share is None else f" at warm-up {round(share * 100, 10):g}%"
        shares = f" x {len(arm['warmup_shares'])} warm-ups" if arm.get("warmup_shares") else ""
        flags = "".join(f"; {flag}" for flag in arm.get("flags", []))
        click.echo(f"{label}{arm['arm']}: rate {arm['best_rate_text']}{warmup} chosen on validation of "
                   f"{len(arm['rates'])} rates{shares} ({arm['runs']} runs; {arm['seeds_at_best']} seed(s) at the "
                   f"chosen cell): {losses}{flags}")  # fmt: skip
    if data.get("unigram_test") is not None:
        click.echo(f"reference:    the unigram loss of the test text, no context: {data['unigram_test']:.4f}")
    choice = data["choice"]
    if choice is None:
        click.echo("choice:       none (no arm trained)")
    elif choice["runner_up"] is None:
        click.echo(f"choice:       {choice['arm']}, the only arm that trained")
    else:
        for number, margin in enumerate(choice["margins"]):
            sure = "one seed on a side: no standard error, no p" if margin["p"] is None else (
                f"± {margin['standard_error']:.4f}, Welch's p = {margin['p']:.3g}, {margin['df']:.1f} degrees of "
                "freedom")  # fmt: skip
            label = "choice:       " if number == 0 else " " * 14
            click.echo(f"{label}{choice['arm']} is lowest on test, {margin['margin']:.4f} below {margin['arm']} "
                       f"({sure}; each arm at its own chosen cell)")  # fmt: skip
    report = data["report"] or f"not written yet (hf-geonorm sweep writes it into {path} after each run)"
    click.echo(f"report:       {report}")
