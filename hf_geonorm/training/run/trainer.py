"""The run of ``hf-geonorm train``, in named steps (``_run``): the output folder (``outputs``), the data
(``data.prepare``), the model (``model_to_train``), the run's record (``record``), transformers' Trainer with the
library's optimizer recipe (``checked_trainer``), and what it saves: the final model, metrics and loss curve (what
the output folder holds, also after a stop: ``outputs``). Each step takes what it needs of the options.

``hf-geonorm train`` is a thin command over :func:`run_training`. With no arguments it trains a tiny GeoNorm
GPT-2 on the Python standard library's own source files (present on every Python install, no download).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerState, TrainingArguments
from transformers.trainer_callback import ProgressCallback

from ..._plumbing.signals import raise_if_signalled
from ...analysis.evaluation import explain_non_finite
from ...checkpoints.patching import family_for
from ...errors import NonFiniteError, require_extra
from ..data.prepare import TrainingData, check_output_apart, data_request, data_source, training_data, world_size
from ..options import (
    BETA1,
    LEGACY_HELD_OUT_RULE,
    MAX_GRAD_NORM,
    MIN_LR_RATIO,
    TrainOptions,
    fields_used,
    trainer_arguments,
)
from ..rate_rule import DefaultRate
from .bridge import BridgeAnneal
from .checkpoints import AtomicCheckpointTrainer, check_resumable, check_resumable_adapters
from .cpu_threads import CoreUse, contention_note
from .model import build_model, check_positions, rate_choice, what_it_computes, with_learning_rate
from .optim import RunSizes, decayed_parameter_names, make_scheduler, peak_reached, run_sizes
from .outputs import (
    RunOutputs,
    RunProgress,
    check_output_path,
    clear_earlier_run,
    curve_title,
    final_card,
    finished_metrics,
    last_evaluation,
    machine_load,
    perplexity,
    prepare_output,
    publish_results,
    run_output,
    save_final_model,
    shared_data,
    training_facts,
)
from .record import check_same_run, learning_rate_facts, recorded_held_out_rule, run_record
from .transformers_internals import check_trainer_overrides


class CheckedTrainer(AtomicCheckpointTrainer):
    """The Trainer of ``hf-geonorm train``, with the library's recipe (``optim``): Trainer's optimizer (``args.optim``,
    AdamW by default, betas ``args.adam_beta1``, ``args.adam_beta2``) with ``args.weight_decay`` on the weight
    matrices only (``get_decay_parameter_names``), and the library's schedule, warm-up over ``args.warmup_steps``
    then cosine to ``min_lr_ratio`` of ``args.learning_rate`` (checkpoints save its state). It stops at the first
    non-finite training or validation loss with a ``NonFiniteError`` naming the step, before anything of that step
    is saved (transformers' Trainer trains on, its logs hide NaN losses): no NaN model is ever published."""

    def __init__(self, *args: Any, min_lr_ratio: float = MIN_LR_RATIO, **kwargs: Any) -> None:
        check_trainer_overrides()
        super().__init__(*args, **kwargs)
        self.min_lr_ratio = min_lr_ratio
        self.evaluation_seconds = self.training_evaluation_seconds = 0.0  # every evaluation; those inside train()

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


class SignalCheck(TrainerCallback):
    """A Ctrl-C or SIGTERM whose exception Python swallowed (in a finalizer or a weakref callback) stops the run at
    Trainer's next event: its start (before the first evaluation), each step, evaluation batch and save."""

    on_train_begin = on_step_begin = on_step_end = on_prediction_step = on_evaluate = on_save = staticmethod(
        lambda *args, **kwargs: raise_if_signalled()
    )


def options_used(options: TrainOptions, tokenizer_from_model: bool, vocab_size: int) -> dict[str, Any]:
    """The options that applied to the run, for ``metrics.json``: the fields it used (``fields_used``: ``model`` or
    ``arch``/``preset``, the bridge's order only with an anneal, every optimizer and data knob), the tokenizer's
    source or the vocabulary trained; not the defaults of what the run did not use."""
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


def _silent(*_: Any) -> None:
    """The log of the processes but the main one, for what each would say alike."""


def run_training(options: TrainOptions, log: Any = print) -> dict[str, Any]:
    """Train as ``options`` say; write checkpoints, the final model (with remote code and a model card),
    ``metrics.json`` and ``loss_curve.png`` under ``options.output``; return the metrics. A resumed run that
    already finished returns its metrics and writes nothing."""
    require_extra("train", "hf-geonorm train")
    options.validate()
    output = Path(options.output).absolute()  # as given: a quoted ~ is a folder ~
    main = _is_main_process()
    reads = {"model": options.model, "tokenizer": options.tokenizer, "data": options.data}
    check_output_path(output, force=options.force, given=options.output, reads=reads)
    check_output_apart(options.data, output, options.output)
    with run_output(output, main, log) as published:
        return _run(options, output, main, log, published)


def _run(options: TrainOptions, output: Path, main: bool, log: Any, published: RunOutputs) -> dict[str, Any]:
    """The run's steps: the output folder (a new run, or the checkpoint a resumed one continues), the data, the
    model, the run's record, Trainer, and what the run saves."""
    data_log = log if main else _silent
    core_use = CoreUse.start()  # the other processes' use of the cores, up to the first step
    checkpoint, resumed_step = prepare_output(output, options.resume, options.force, options.max_steps, main)
    if resumed_step == options.max_steps:
        finished = finished_metrics(output, resumed_step)
        if finished is not None:
            train_on = (f"give a --max-steps above {resumed_step}" if checkpoint is not None else
                        f"its checkpoints were removed at its end: start a new run with --model {output / 'final'}")
            if main:
                log(f"the run in {output} already finished at step {resumed_step}; nothing to do (its final model "
                    f"and metrics.json are left as they are; to train on, {train_on})")  # fmt: skip
            return finished
        if main:
            log(f"{checkpoint.name} is at --max-steps {resumed_step}: nothing left to train; writing the final model")
    if checkpoint is not None:  # evaluated on the held-out text it was evaluated on before
        options = replace(options, held_out_rule=recorded_held_out_rule(checkpoint))
        if options.held_out_rule == LEGACY_HELD_OUT_RULE and main:
            log(f"--resume: {checkpoint.name} holds out validation and test by the rule of an earlier hf-geonorm "
                f"(held-out rule {LEGACY_HELD_OUT_RULE}, files in path order, none longer than the evaluation): kept, "
                "so that its validation loss stays comparable")  # fmt: skip
    torch.manual_seed(options.seed)
    check_positions(options.model, options.seq_len)  # before any tokenizing
    request = data_request(options)
    source = data_source(request, data_log)  # the corpus and its tokenizer: nothing tokenized yet
    built, options = model_to_train(options, source.tokenizer, source.tokenizer_from_model, checkpoint, main, log)
    built.sizes = run_sizes(built.model, options, resumed_step)
    for line in built.sizes.lines(options) if main else ():
        log(line)
    held_out = replace(options, eval_blocks=options.held_out_blocks())  # what shapes the data, as recorded before
    data_key = (source.corpus.label, source.corpus.fingerprint)
    record = run_record(held_out, data_key, source.tokenizer_hash, built.settings, world_size(),
                        learning_rate_facts(built.rate))  # fmt: skip
    if checkpoint is not None:  # before the data is tokenized: a changed run is refused at once
        check_same_run(checkpoint, record, resumed_step, data_log)
    data = training_data(source, request, data_log)
    trainer, progress = checked_trainer(options, built, data, record, checkpoint, resumed_step, output, published,
                                        main, log)  # fmt: skip
    if main and trainer.args.device.type == "cpu":
        note = contention_note(torch.get_num_threads(), len(core_use.cores), core_use.others_busy())
        if note is not None:
            log(note)
    if options.force and main:
        clear_earlier_run(output, log)
    seconds = train(trainer, progress, checkpoint, resumed_step == options.max_steps)
    return save_results(options, trainer, built, data, resumed_step, seconds, output, published, log)


def train(trainer: CheckedTrainer, progress: RunProgress, checkpoint: Path | None, trained: bool) -> float:
    """Train from ``checkpoint`` (None: from the start), or only load it when it ``trained`` every step already
    (a run killed while writing ``final/``); the seconds it took."""
    start = time.perf_counter()
    if checkpoint is not None and trained:
        trainer._load_from_checkpoint(str(checkpoint))  # what train() would do first, then run one step too many
        trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    else:
        try:
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
        finally:
            progress.restore_bars()
    trainer.training_evaluation_seconds = trainer.evaluation_seconds  # the final and test evaluations come after
    return time.perf_counter() - start


def save_results(
    options: TrainOptions,
    trainer: CheckedTrainer,
    built: ModelToTrain,
    data: TrainingData,
    resumed_step: int,
    seconds: float,
    output: Path,
    published: RunOutputs,
    log: Any,
) -> dict[str, Any]:
    """The save step: the final validation and test losses, ``final/`` (the model with its card), ``metrics.json``
    and the loss curve; the metrics."""
    final_eval = last_evaluation(trainer.state) or trainer.evaluate()
    loss = final_eval["eval_loss"]  # finite: CheckedTrainer.evaluate
    test_loss = trainer.evaluate(eval_dataset=data.test, metric_key_prefix="test")["test_loss"]
    to_save = built.model.merge_and_unload() if options.lora else built.model
    if built.use_cache is not None:
        to_save.config.use_cache = built.use_cache
    # FSDP: every process takes part in gathering the full weights; the main process writes them
    state_dict = trainer.accelerator.get_state_dict(trainer.model) if trainer.is_fsdp_enabled else None
    steps = trainer.state.global_step
    peak = peak_reached(options.lr, steps, options.warmup_steps, options.max_steps, options.min_lr_ratio)
    shared = shared_data(data.name, data.facts["fingerprint"])
    card = final_card(options.model, training_facts(options, shared, steps, peak, loss, test_loss, built.rate))
    if trainer.is_world_process_zero():
        save_final_model(to_save, data.tokenizer, state_dict, card, output / "final", published)
    metrics = run_metrics(options, trainer, data, built, to_save.config, resumed_step, seconds, loss, test_loss)
    if trainer.is_world_process_zero():
        title = curve_title(to_save.config, built.parameters, options.lr, options.bridge_anneal, data.label)
        publish_results(output, metrics, title, not options.keep_checkpoints, published, log)
    return metrics


@dataclass
class ModelToTrain:
    """The model step's model (with its LoRA adapters when the run trains them), the GeoNorm settings it was built
    with (before LoRA and the bridge anneal: what the run's record holds), its KV-cache default (Trainer turns the
    cache off for training; the saved model keeps the model's), its parameter count and where its peak learning rate
    comes from (``model.rate_choice``)."""

    model: torch.nn.Module
    settings: dict[str, Any]
    use_cache: bool | None
    parameters: int
    rate: DefaultRate
    sizes: RunSizes | None = None  # what the run will take (``optim.run_sizes``), once its options are complete


def model_to_train(
    options: TrainOptions, tokenizer: Any, own_tokenizer: bool, checkpoint: Path | None, main: bool, log: Any
) -> tuple[ModelToTrain, TrainOptions]:
    """The model step: the model (``build_model``) checked against the ``checkpoint`` a resumed run continues, with
    LoRA adapters for ``--lora``; and ``options`` with the defaults that depend on it (``with_learning_rate``),
    which ``log`` states in the ``main`` process."""
    model = build_model(options, tokenizer, own_tokenizer=own_tokenizer, log=log if main else None)
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
    parameters = sum(p.numel() for p in model.parameters())
    log(f"model: {type(model).__name__}, {parameters / 1e6:.2f}M parameters, {what_it_computes(model.config, options)}")
    # before the default is set: --lr given (by whom) or not
    rate = rate_choice(options.lr, options.model, model.config, options.lr_source)
    options, defaults = with_learning_rate(options, model.config)
    for line in defaults if main else ():
        log(line)
    return ModelToTrain(model, settings, use_cache, parameters, rate), options


def checked_trainer(options: TrainOptions, built: ModelToTrain, data: TrainingData, record: dict[str, Any],
                    checkpoint: Path | None, resumed_step: int, output: Path, published: RunOutputs, main: bool,
                    log: Any) -> tuple[CheckedTrainer, RunProgress]:  # fmt: skip
    """The Trainer step: ``CheckedTrainer`` over the model and the data, with the ``TrainingArguments`` the options
    set (``trainer_arguments``) and the library's recipe, and its progress bar (``RunProgress``)."""
    callbacks = trainer_callbacks(built.model, options.bridge_anneal, options.bridge_order, resumed_step)
    if options.warmup_steps >= options.max_steps and main:
        warnings.warn(
            f"--warmup-steps {options.warmup_steps} is not below --max-steps {options.max_steps}: the learning rate "
            f"never reaches --lr {options.lr:g} nor decays; give fewer --warmup-steps (a few percent of the steps)",
            stacklevel=4,
        )
    args = TrainingArguments(
        output_dir=str(output),
        **trainer_arguments(options),  # what the options set
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
        model=built.model,
        published=published,
        run_record=record,
        tokenizer=data.tokenizer,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.val,
        callbacks=callbacks,
    )
    published.watch_tensorboard(trainer)
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
    return trainer, progress


def trainer_callbacks(model: Any, anneal_steps: int | None, order: str, resumed_step: int) -> list[TrainerCallback]:
    """What runs at each step besides training: the ``SignalCheck``, and the bridge anneal over
    ``anneal_steps`` (``--bridge-anneal``, in ``order``), which sets the model's bridge where the checkpoint of
    ``resumed_step`` last ran it (0: the start)."""
    callbacks: list[TrainerCallback] = [SignalCheck()]
    if anneal_steps is not None:
        anneal = BridgeAnneal(model, anneal_steps, model.config.geo_bridge, order)
        model.config.geo_bridge = anneal.value_at(resumed_step)
        callbacks.append(anneal)
    return callbacks


def run_metrics(
    options: TrainOptions,
    trainer: CheckedTrainer,
    data: TrainingData,
    built: ModelToTrain,
    config: Any,
    resumed_step: int,
    seconds: float,
    loss: float,
    test_loss: float,
) -> dict[str, Any]:
    """What ``metrics.json`` holds of the run: its losses, steps, time and throughput, the model (``built``'s
    parameters, its saved ``config``), the data, the options that applied and where the learning rate came from."""
    training_seconds = seconds - trainer.training_evaluation_seconds  # the evaluations inside train() left out
    steps_run = trainer.state.global_step - resumed_step
    blocks_per_step = options.batch_size * options.gradient_accumulation_steps * trainer.args.world_size
    tokens = steps_run * blocks_per_step * options.seq_len
    return {
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
        "parameters": built.parameters,
        "estimated_sizes": built.sizes.to_dict() if built.sizes is not None else None,  # bytes: memory, disk
        "model_type": config.model_type,
        "settings": config.geonorm_settings().to_dict(),
        "data": data.label,
        "data_facts": data.facts,
        "options": options_used(options, data.tokenizer_from_model, len(data.tokenizer)),
        "learning_rate": learning_rate_facts(built.rate),
        "log_history": trainer.state.log_history,
    }
