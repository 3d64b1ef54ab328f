"""``hf-geonorm train``: a thin command over transformers' Trainer (hf_geonorm.training.trainer)."""

from __future__ import annotations

from typing import Any

import click

from .errors import first_line
from .options import BRIDGE_ORDERS, PRESET_NAMES, _option_words, pop_settings, settings_options


@click.command()
@click.option("--model", "model_path", type=click.Path(exists=True, file_okay=False),
              help="A config folder from `hf-geonorm init` (trained from scratch) or a checkpoint folder (stock ones "
              "are converted) [default: --arch at --preset size].")  # fmt: skip
@click.option("--arch", default="gpt2", show_default=True, help="Stock model type to build when --model is not given.")
@click.option("--preset", type=click.Choice(PRESET_NAMES), default="tiny", show_default=True,
              help="Model size when --model is not given.")  # fmt: skip
@settings_options
@click.option("--data", help="A text file, a folder of text files, or a `datasets` name (online) "
              "[default: the Python standard library's source].")  # fmt: skip
@click.option("--tokenizer", "tokenizer_path", help="Tokenizer folder [default: the model folder's, else a byte-level "
              "BPE trained on the data].")  # fmt: skip
@click.option("--max-tokens", type=click.IntRange(min=1), metavar="N",
              help="Train on the first N tokens of the data [default: all of it].")  # fmt: skip
@click.option("--streaming", is_flag=True, help="Read a `datasets` corpus as a stream (nothing downloaded whole).")
@click.option("--data-workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes that tokenize the data.")  # fmt: skip
@click.option("--data-cache", type=click.Path(file_okay=False), metavar="DIR",
              help="Folder the tokenized data (Arrow files) is cached in, shared by runs on the same data "
              "[default: $HF_GEONORM_DATA_CACHE, else ~/.cache/hf-geonorm/data].")  # fmt: skip
@click.option("--vocab-size", type=click.IntRange(min=260),
              help="Vocabulary of the tokenizer trained on the fly (not with a --model folder that has a tokenizer) "
              "[default: 2048].")  # fmt: skip
@click.option("--seq-len", type=click.IntRange(min=2), default=128, show_default=True,
              help="Tokens per block: the texts, joined by the end-of-text token, are cut into blocks of this "
              "length (the last 5%, at most 64 blocks, for validation); also the context length of a model built "
              "from --arch.")  # fmt: skip
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="Blocks per step and process (with several processes the global batch is this times their "
              "number); also the evaluation batch.")  # fmt: skip
@click.option("--gradient-accumulation-steps", type=click.IntRange(min=1), default=1, show_default=True,
              metavar="N", help="Batches whose gradients add up to one optimizer step: each step trains on "
              "--batch-size x N x processes blocks, with the memory of --batch-size.")  # fmt: skip
@click.option("--max-steps", type=click.IntRange(min=1), default=300, show_default=True,
              help="Optimizer steps the run ends at (a resumed run counts its checkpoint's steps).")  # fmt: skip
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=2e-3, show_default=True,
              help="Peak learning rate of AdamW: reached after --warmup-steps, then a cosine decay to "
              "--min-lr-ratio times it at --max-steps.")  # fmt: skip
@click.option("--warmup-steps", type=click.IntRange(min=0), default=30, show_default=True,
              help="Steps over which the learning rate rises linearly to --lr (step s of them at (s+1)/STEPS of "
              "it).")  # fmt: skip
@click.option("--min-lr-ratio", type=click.FloatRange(min=0, max=1), default=0.1, show_default=True,
              help="Where the cosine decay ends, as a share of --lr.")  # fmt: skip
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.1, show_default=True,
              help="AdamW weight decay, on the weight matrices only (not on norms, biases, embeddings or "
              "GeoNorm's step parameters).")  # fmt: skip
@click.option("--adam-beta2", type=click.FloatRange(min=0, max=1, max_open=True), default=0.95, show_default=True,
              help="AdamW's second-moment decay (beta1 is 0.9); gradients are clipped to norm 1.0.")  # fmt: skip
@click.option("--bf16", "precision", flag_value="bf16", help="bfloat16 mixed precision.")
@click.option("--fp16", "precision", flag_value="fp16", help="float16 mixed precision (CUDA).")
@click.option("--compile", "use_compile", is_flag=True, help="torch.compile the model.")
@click.option("--gradient-checkpointing", is_flag=True, help="Recompute activations in the backward pass.")
@click.option("--fsdp", is_flag=True, help="Shard parameters with FSDP2 (launch with torchrun or accelerate).")
@click.option("--lora", is_flag=True, help="Train LoRA adapters (PEFT) instead of all weights; merged at the end.")
@click.option("--eval-every", type=click.IntRange(min=1), default=50, show_default=True,
              help="Steps between evaluations (and checkpoints).")  # fmt: skip
@click.option("--logging-steps", type=click.IntRange(min=1), default=10, show_default=True,
              help="Steps between the logged training loss, learning rate and gradient norm.")  # fmt: skip
@click.option("--report-to", default="none", show_default=True, metavar="TRACKERS",
              help="Where the logs also go: none, or tensorboard, trackio, wandb (a comma list); tensorboard writes "
              "under --output/runs.")  # fmt: skip
@click.option("--bridge-anneal", type=click.IntRange(min=1), metavar="STEPS",
              help="Anneal geo_bridge from the model's value b to 1.0 over STEPS steps (uptraining a converted "
              "Pre-Norm checkpoint into GeoNorm): step s runs at b + (1 - b) s/STEPS, 1.0 from step STEPS on "
              "(at most --max-steps).")  # fmt: skip
@click.option("--bridge-order", type=click.Choice(BRIDGE_ORDERS), default="together", show_default=True,
              help="together: every update's bridge moves at once; last-first: one update at a time from the "
              "last, the updates whose conversion costs most taking longest (needs --bridge-anneal and a "
              "checkpoint converted with --calibrate).")  # fmt: skip
@click.option("--output", default="geonorm-run", show_default=True, type=click.Path(file_okay=False),
              help="Folder for checkpoints, the final model, metrics.json and loss_curve.png.")  # fmt: skip
@click.option("--resume", is_flag=True, help="Resume from the newest whole checkpoint in --output (a finished run is "
              "left as it is).")  # fmt: skip
@click.option("--force", is_flag=True, help="Start a new run in a non-empty --output: the earlier run's "
              "checkpoints, final/, metrics.json and loss_curve.png are removed when training starts; other files "
              "stay.")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the model's initialisation and of the order the training blocks are drawn in.")  # fmt: skip
def train(
    model_path: str | None,
    arch: str,
    preset: str,
    data: str | None,
    tokenizer_path: str | None,
    max_tokens: int | None,
    streaming: bool,
    data_workers: int,
    data_cache: str | None,
    vocab_size: int | None,
    seq_len: int,
    batch_size: int,
    gradient_accumulation_steps: int,
    max_steps: int,
    lr: float,
    warmup_steps: int,
    min_lr_ratio: float,
    weight_decay: float,
    adam_beta2: float,
    precision: str | None,
    use_compile: bool,
    gradient_checkpointing: bool,
    fsdp: bool,
    lora: bool,
    eval_every: int,
    logging_steps: int,
    report_to: str,
    bridge_anneal: int | None,
    bridge_order: str,
    output: str,
    resume: bool,
    force: bool,
    seed: int,
    **kwargs: Any,
) -> None:
    """Train a GeoNorm model with transformers' Trainer.

    With no arguments: a tiny GeoNorm GPT-2 on the Python standard library's own source files (no download),
    a few minutes on a CPU. Writes checkpoints (they reload through the Auto classes and resume), the final
    model with its remote code, metrics.json and loss_curve.png to --output.
    """
    settings = pop_settings(kwargs)
    from hf_geonorm.evaluation import NonFiniteError
    from hf_geonorm.loading import SettingsError
    from hf_geonorm.training.options import TrainOptions, default_data_cache
    from hf_geonorm.training.trainer import run_training

    options = TrainOptions(
        model=model_path, arch=arch, preset=preset, settings=settings, data=data, tokenizer=tokenizer_path,
        max_tokens=max_tokens, streaming=streaming, data_workers=data_workers,
        data_cache=data_cache or default_data_cache(), vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps, max_steps=max_steps, lr=lr,
        warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio, weight_decay=weight_decay, adam_beta2=adam_beta2,
        precision=precision or "fp32", compile=use_compile,
        gradient_checkpointing=gradient_checkpointing, fsdp=fsdp, lora=lora, eval_every=eval_every,
        logging_steps=logging_steps, report_to=report_to, output=output,
        bridge_anneal=bridge_anneal, bridge_order=bridge_order, resume=resume, force=force, seed=seed,
    )  # fmt: skip
    try:
        options.validate()
        if model_path is None:
            import hf_geonorm

            hf_geonorm.family_for(arch)
        run_training(options, log=click.echo)
    except SettingsError as error:  # a setting given on the command line: named as its option
        raise click.UsageError(_option_words(first_line(error))) from None
    except NonFiniteError as error:  # names the model's settings, as perplexity does
        raise click.ClickException(_option_words(first_line(error, limit=600))) from None
    except ValueError as error:  # settings from a config.json keep their field names and name the file
        raise click.ClickException(first_line(error, limit=600)) from None
