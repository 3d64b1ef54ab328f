"""The run of ``hf-geonorm train``: data, model, transformers' Trainer with the library's optimizer recipe, the
final model, metrics and loss curve (what the output folder holds, also after a stop: ``outputs``).

``hf-geonorm train`` is a thin command over :func:`run_training`. With no arguments it trains a tiny GeoNorm
GPT-2 on the Python standard library's own source files (present on every Python install, no download).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerState, TrainingArguments
from transformers.trainer_callback import ProgressCallback

from ...analysis.evaluation import explain_non_finite
from ...errors import NonFiniteError, first_line
from ...files.atomic import atomic_directory, raise_if_terminated
from ...files.output_lock import output_lock
from ...patching import family_for
from ...sharing.hub import save_shareable
from ...sharing.model_card import CardInfo, inherited_card_info
from ..data.pipeline import TokenBlocks, tokenizer_digest
from ..data.prepare import data_source, training_data, world_size
from ..options import BETA1, MAX_GRAD_NORM, MIN_LR_RATIO, TrainOptions, evaluated_blocks, fields_used, trainer_arguments
from .bridge import BridgeAnneal
from .checkpoints import AtomicCheckpointTrainer, check_resumable, check_resumable_adapters, disk_full_named
from .model import build_model, check_positions, what_it_computes, with_learning_rate
from .optim import decayed_parameter_names, make_scheduler
from .outputs import (
    RunProgress,
    check_output_path,
    clear_earlier_run,
    curve_title,
    finished_metrics,
    kept_checkpoints,
    machine_load,
    output_removed_on_failure,
    perplexity,
    plot_losses,
    prepare_output,
    replace_file,
    strict_json,
    training_facts,
)
from .record import check_same_run, run_record
from .transformers_internals import check_trainer_overrides


class CheckedTrainer(AtomicCheckpointTrainer):
    """The Trainer of ``hf-geonorm train``. It trains with the library's recipe (``optim``): Trainer's optimizer
    (``args.optim``, AdamW by default, with betas (``args.adam_beta1``, ``args.adam_beta2``)) with
    ``args.weight_decay`` on the weight matrices only (``get_decay_parameter_names``), and the library's schedule,
    warm-up over ``args.warmup_steps`` then cosine to ``min_lr_ratio`` of ``args.learning_rate``, whose state
    checkpoints save and a resumed run restores. It stops at the first non-finite training or validation loss with a
    ``NonFiniteError`` naming the step, before anything of that step is saved (transformers' Trainer trains on,
    and its logs hide NaN losses), so no NaN model is ever published as a checkpoint or as final."""

    def __init__(self, *args: Any, min_lr_ratio: float = MIN_LR_RATIO, **kwargs: Any) -> None:
        check_trainer_overrides()
        super().__init__(*args, **kwargs)
        self.min_lr_ratio = min_lr_ratio
        self.evaluation_seconds = 0.0  # every evaluation so far: kept out of the training throughput

    def get_decay_parameter_names(self, model: torch.nn.Module) -> list[str]:
        """The weight matrices (``optim.decayed_parameter_names``): not the norms, biases, embeddings or GeoNorm's
        step parameters, which Trainer's own rule (by module type and name) would decay in part."""
        return sorted(decayed_parameter_names(model))

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        if self.lr_scheduler is None:
            optimizer = self.optimizer if optimizer is None else optimizer
            warmup = self.args.get_warmup_steps(num_training_steps)
            self.lr_scheduler = make_scheduler(optimizer, warmup, num_training_steps, self.min_lr_ratio)
        return self.lr_scheduler

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not torch.isfinite(loss).all():
            self._stop(f"the training loss at step {self.state.global_step + 1}", loss.item(), inputs["input_ids"])
        return loss

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval") -> dict:
        started = time.perf_counter()
        metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        self.evaluation_seconds += time.perf_counter() - started
        loss = metrics.get(f"{metric_key_prefix}_loss")
        if loss is not None and not math.isfinite(loss):
            what = "validation" if metric_key_prefix == "eval" else metric_key_prefix
            blocks = (eval_dataset or self.eval_dataset).blocks
            self._stop(f"the {what} loss at step {self.state.global_step}", loss, blocks)
        return metrics

    def _stop(self, what: str, value: float, blocks: torch.Tensor) -> None:
        # the diagnosis runs the model again: in one process only (sharded models forward in all at once)
        why = f" ({explain_non_finite(self.model, blocks[:1].tolist())})" if self.args.world_size == 1 else ""
        raise NonFiniteError(
            f"{what} is {value}{why}; the run stops, with no final model: lower --lr (it is "
            f"{self.args.learning_rate:g}), or train in fp32 rather than fp16/bf16"
        )


class TerminationCheck(TrainerCallback):
    """A SIGTERM whose ``Terminated`` was swallowed (raised inside a finalizer, where Python ignores it) stops the
    run at the next step rather than at its end."""

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        raise_if_terminated()


def last_evaluation(state: TrainerState) -> dict[str, float] | None:
    """The evaluation Trainer ran at the last step (when it is an evaluation step), as ``evaluate`` returns it:
    reused for the final metrics rather than run a second time on the same weights."""
    for entry in reversed(state.log_history):
        if "eval_loss" in entry:
            return entry if entry.get("step") == state.global_step else None
    return None


def options_used(options: TrainOptions, tokenizer_from_model: bool, vocab_size: int) -> dict[str, Any]:
    """The options that applied to the run, for ``metrics.json``: the fields the declaration says it used
    (``fields_used``: ``model`` or ``arch``/``preset``, the bridge's order only with an anneal, every optimizer and
    data knob), the tokenizer's source or the vocabulary trained; not the defaults of what the run did not use."""
    used = fields_used(options)
    if tokenizer_from_model or options.tokenizer is not None:
        del used["vocab_size"]
    else:
        used["vocab_size"] = vocab_size  # of the tokenizer trained on the fly
        del used["tokenizer"]
    if options.save_every is None:
        used["save_every"] = options.eval_every
    return used


def _is_main_process() -> bool:
    """Rank 0 (or a single process), known before the Trainer starts the process group."""
    return os.environ.get("RANK", "0") == "0"


def run_training(options: TrainOptions, log: Any = print) -> dict[str, Any]:
    """Train as ``options`` say; write checkpoints, the final model (with remote code and a model card),
    ``metrics.json`` and ``loss_curve.png`` under ``options.output``; return the metrics. A resumed run that
    already finished returns its metrics and writes nothing."""
    options.validate()
    output = Path(options.output).expanduser().absolute()
    main = _is_main_process()
    check_output_path(output, options)
    with output_removed_on_failure(output, main, log) as published:
        with output_lock(output, "train") if main else contextlib.nullcontext():  # the other processes: the same run
            return _run(options, output, main, log, published)


def _run(options: TrainOptions, output: Path, main: bool, log: Any, published: list[Path]) -> dict[str, Any]:
    checkpoint, resumed_step = prepare_output(options, output, main)
    if checkpoint is not None and resumed_step == options.max_steps:
        finished = finished_metrics(output, resumed_step)
        if finished is not None:
            if main:
                log(
                    f"the run in {output} already finished at step {resumed_step}; nothing to do (its final model "
                    f"and metrics.json are left as they are; give a --max-steps above {resumed_step} to train on)"
                )
            return finished
        if main:
            log(f"{checkpoint.name} is at --max-steps {resumed_step}: nothing left to train; writing the final model")
    torch.manual_seed(options.seed)
    check_positions(options)  # before any tokenizing
    data_log = log if main else (lambda *_: None)
    corpus, tokenizer, tokenizer_from_model = data_source(options, data_log)
    model = build_model(options, tokenizer, own_tokenizer=tokenizer_from_model, log=log if main else None)
    # Trainer turns the KV cache off for training (TrainingArguments.use_cache); the saved model keeps the model's
    use_cache = getattr(model.config, "use_cache", None)
    settings = model.config.geonorm_settings().to_dict()  # as built: before LoRA and the bridge anneal
    if checkpoint is not None:
        ignore = ("geo_bridge",) if options.bridge_anneal else ()
        check_resumable(model, checkpoint, ignore=ignore, given=options.settings)
    if options.lora:
        from peft import LoraConfig, get_peft_model

        conv1d = family_for(model.config.model_type).layout.conv1d  # GPT-2's Conv1D stores weights transposed
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, fan_in_fan_out=conv1d))
        if checkpoint is not None:
            check_resumable_adapters(model, checkpoint)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {type(model).__name__}, {n_params / 1e6:.2f}M parameters, {what_it_computes(model.config, options)}")
    options, defaults = with_learning_rate(options, model.config)
    for line in defaults if main else ():
        log(line)
    data_key = (corpus.label, corpus.fingerprint)
    held_out = replace(options, eval_blocks=options.held_out_blocks())  # what shapes the data, as recorded before
    record = run_record(held_out, data_key, tokenizer_digest(tokenizer), settings, world_size())
    if checkpoint is not None:  # before the data is tokenized: a changed run is refused at once
        check_same_run(checkpoint, record, resumed_step, log if main else lambda *_: None)
    data = training_data(options, corpus, tokenizer, tokenizer_from_model, data_log)
    evaluated = evaluated_blocks(options, world_size())
    if evaluated < max(len(data.val), len(data.test)):
        data.val, data.test = TokenBlocks(data.val.blocks[:evaluated]), TokenBlocks(data.test.blocks[:evaluated])
        data_log(f"each evaluation reads the first {evaluated} of those blocks (validation, and test at the end): the "
                 "default for a run this short, a tenth of its training compute at most; --eval-blocks N evaluates "
                 "N")  # fmt: skip
    callbacks: list[TrainerCallback] = [TerminationCheck()]
    if options.bridge_anneal is not None:
        anneal = BridgeAnneal(model, options.bridge_anneal, model.config.geo_bridge, options.bridge_order)
        model.config.geo_bridge = anneal.value_at(resumed_step)  # what the checkpoint last ran at (0: the start)
        callbacks.append(anneal)
    if options.warmup_steps >= options.max_steps and main:
        warnings.warn(
            f"--warmup-steps {options.warmup_steps} is not below --max-steps {options.max_steps}: the learning rate "
            f"never reaches --lr {options.lr:g} nor decays; give fewer --warmup-steps (a few percent of the steps)",
            stacklevel=3,
        )
    args = TrainingArguments(
        output_dir=str(output),
        **trainer_arguments(options),  # what the options set, as each declares its counterpart
        adam_beta1=BETA1,
        max_grad_norm=MAX_GRAD_NORM,
        eval_strategy="steps",
        eval_on_start=checkpoint is None,  # where the run starts from (a fine-tune's starting point)
        save_strategy="steps",
        save_total_limit=2,
        logging_nan_inf_filter=False,  # a NaN loss is an error (CheckedTrainer), never averaged away
        disable_tqdm=False,  # the progress bar: RunProgress
        dataloader_num_workers=0,
        # the CPU only where torch sees no accelerator of any kind (CUDA, MPS, XPU, ...): Trainer then needs use_cpu
        # to start several processes over gloo and to train in bf16 there; elsewhere the device is Trainer's choice
        use_cpu=not torch.accelerator.is_available(),
        dataloader_pin_memory=torch.accelerator.is_available(),
    )
    if "tensorboard" in args.report_to and not (output / "runs").exists():
        published.append(output / "runs")  # the event files of a run that fails are removed with it
    trainer = CheckedTrainer(
        min_lr_ratio=options.min_lr_ratio,
        model=model,
        published=published,
        run_record=record,
        tokenizer=tokenizer,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.val,
        callbacks=callbacks,
    )
    if main:  # the device is Trainer's (accelerate's) choice: CUDA, MPS, XPU, ... or the CPU
        log(f"device: {trainer.args.device}, {trainer.args.world_size} process(es), precision {options.precision}")
    trainer.remove_callback(ProgressCallback)
    progress = RunProgress()
    trainer.add_callback(progress)
    if options.fsdp and not trainer.is_fsdp_enabled:
        raise ValueError(
            f"--fsdp: accelerate did not shard this {trainer.accelerator.distributed_type.value} run with FSDP; "
            "launch it with torchrun or accelerate launch on GPUs, or drop --fsdp"
        )
    if options.force and main:
        clear_earlier_run(output, log)
    start = time.perf_counter()
    if checkpoint is not None and resumed_step == options.max_steps:  # e.g. killed while writing final/
        trainer._load_from_checkpoint(str(checkpoint))  # what train() would do first, then run one step too many
        trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    else:
        try:
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
        finally:
            progress.restore_bars()
    seconds = time.perf_counter() - start
    training_seconds = seconds - trainer.evaluation_seconds  # the evaluations inside train() left out
    final_eval = last_evaluation(trainer.state) or trainer.evaluate()
    loss = final_eval["eval_loss"]  # finite: CheckedTrainer.evaluate
    test_loss = trainer.evaluate(eval_dataset=data.test, metric_key_prefix="test")["test_loss"]
    steps_run = trainer.state.global_step - resumed_step
    blocks_per_step = options.batch_size * options.gradient_accumulation_steps * trainer.args.world_size
    tokens = steps_run * blocks_per_step * options.seq_len
    to_save = model.merge_and_unload() if options.lora else model
    if use_cache is not None:
        to_save.config.use_cache = use_cache
    # FSDP: every process takes part in gathering the full weights; the main process writes them
    state_dict = trainer.accelerator.get_state_dict(trainer.model) if trainer.is_fsdp_enabled else None
    final_dir = output / "final"
    lineage = inherited_card_info(options.model) if options.model is not None else CardInfo()
    card = replace(lineage, training=training_facts(options, data.label, trainer.state.global_step, loss, test_loss))
    if trainer.is_world_process_zero():
        with atomic_directory(final_dir, force=True) as tmp, disk_full_named(tmp, final_dir):
            save_shareable(
                to_save, tmp, tokenizer=tokenizer, card_info=card, **({"state_dict": state_dict} if state_dict else {})
            )
        published.append(final_dir)
    metrics = {
        "final_eval_loss": loss,
        "final_eval_perplexity": perplexity(loss),
        "final_test_loss": test_loss,  # held-out documents apart from validation's: report this, choose on that
        "steps": trainer.state.global_step,
        "resumed_from_step": resumed_step,
        "train_seconds": seconds,  # this process's trainer.train(), evaluations and checkpoints included
        "training_seconds": training_seconds,  # train_seconds less the evaluations inside it: tokens/s divides by it
        "evaluation_seconds": trainer.evaluation_seconds,  # every evaluation of the run, the final and test ones too
        "evaluated_blocks": {"validation": len(data.val), "test": len(data.test)},
        "tokens": tokens,  # trained on in this run: steps x batch x accumulation x processes x seq_len
        "tokens_per_step": blocks_per_step * options.seq_len,
        # tokens of the steps run, all processes, over train()'s time less its evaluations; on a shared machine it
        # says more about the others' load (below)
        "tokens_per_second": tokens / training_seconds if steps_run else 0.0,
        "machine": machine_load(),
        "parameters": n_params,
        "model_type": to_save.config.model_type,
        "settings": to_save.config.geonorm_settings().to_dict(),
        "data": data.label,
        "data_facts": data.facts,
        "options": options_used(options, data.tokenizer_from_model, len(data.tokenizer)),
        "log_history": trainer.state.log_history,
    }
    if not trainer.is_world_process_zero():
        return metrics
    text = strict_json(metrics)
    replace_file(output / "metrics.json", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    published.append(output / "metrics.json")
    curve = output / "loss_curve.png"
    try:
        plot_losses(metrics["log_history"], curve, curve_title(to_save.config, n_params, options, data.label))
        published.append(curve)
    except Exception as error:  # noqa: BLE001 - the run is done; the plot is reported as not written
        warnings.warn(f"{curve} was not written: {type(error).__name__}: {first_line(error)}", stacklevel=2)
        curve = None
    resumed = f" (steps {resumed_step + 1}-{metrics['steps']} in this run)" if resumed_step else ""
    log(
        f"final validation loss {metrics['final_eval_loss']:.4f} (perplexity {metrics['final_eval_perplexity']:.2f}), "
        f"test loss {test_loss:.4f}; "
        f"{metrics['tokens_per_second']:.0f} tokens/s{resumed} (evaluations, {trainer.evaluation_seconds:.0f} s, left "
        f"out); model in {final_dir}; metrics in "
        f"{output / 'metrics.json'}" + (f"; loss curve in {curve}" if curve else "")
    )
    log(kept_checkpoints(output, options.save_final_only))
    return metrics
