"""Supervised fine-tuning of a causal LM on prompt/completion examples (TRL `SFTTrainer`): the
experience model, and the policy in `policy.mode: generate`.

A run lives in one output directory:

    output_dir/run.json            what the run is: the examples' hashes and the training settings
    output_dir/checkpoints/        checkpoint-<step> every `save_steps` (the last 2 are kept)
    output_dir/model/              the final model + tokenizer, and train_result.json written last

Re-running `train_sft` on the same directory with `resume=True`:
- the run finished (model/train_result.json exists): the recorded result comes back with
  `reused=True` and nothing is trained, so a retried pipeline task is a cache hit;
- the run crashed: training continues from the latest complete checkpoint (one whose
  trainer_state.json, written last, exists) with the optimizer, scheduler, RNG and data order
  restored, so the step count continues and the result matches an uninterrupted run;
- the directory holds a different run (other examples, settings or seed, including `epochs`):
  `DreamgymError` naming what changed. Continuing someone else's checkpoints would silently mix
  two runs; `resume=False` clears the directory and starts afresh.

Examples longer than `max_length` tokens keep their completion whole and lose the start of the
prompt (left truncation at a token boundary). The prompt builder puts the retrieved worked
examples and older history first and the current state and action last, so what is cut is the
least important context; dropping such examples instead would bias training against long
episodes. The number truncated is reported. A completion that alone does not fit is an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    PrinterCallback,
    TrainerCallback,
)

from dreamgym.errors import DreamgymError
from dreamgym.lm.model import (
    FROM_SCRATCH,
    ModelSettings,
    deterministic_kernels,
    init_model,
    load_pretrained,
    save_model,
    train_tokenizer,
)
from dreamgym.sections import config_part

if TYPE_CHECKING:
    from trl import SFTConfig, SFTTrainer

RESULT_FILE = "train_result.json"
# Log about 100 points per run (a fraction < 1 is a share of the total steps for the Trainer).
LOGGING_FRACTION = 0.01


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a training run produced and how fast; stored beside the model as train_result.json."""

    model_dir: Path
    steps: int
    epochs: float
    train_losses: list[tuple[int, float]]
    eval_losses: list[tuple[int, float]]
    eval_loss: float | None
    seconds: float  # wall time of the call that trained, tokenizer and data preparation included
    tokens_per_second: float  # non-padding training tokens per second of the training loop
    truncated: int  # training examples whose prompt was left-truncated
    parameters: int
    resumed_from: int | None = None  # the checkpoint step training continued from
    reused: bool = False  # True when a finished run was found and nothing was trained

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "model_dir": str(self.model_dir)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> TrainResult:
        values = json.loads(text)
        values["model_dir"] = Path(values["model_dir"])
        for key in ("train_losses", "eval_losses"):
            values[key] = [tuple(point) for point in values[key]]
        return cls(**values)


# --- examples -------------------------------------------------------------------------------


def _with_eos(completion: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """The completion as TRL tokenizes it: with EOS appended unless already there."""
    eos = tokenizer.eos_token
    return completion if completion.endswith(eos) else completion + eos


def _length(tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str) -> int:
    return len(tokenizer(prompt + _with_eos(completion, tokenizer))["input_ids"])


def fit_example(prompt: str, completion: str, tokenizer: PreTrainedTokenizerBase, max_length: int) -> tuple[str, bool]:
    """The prompt, left-truncated at a token boundary so that prompt + completion + EOS fit in
    `max_length` tokens; and whether it was cut. Re-measures after each cut because re-tokenizing
    the shortened text can merge differently at the new start."""
    excess = _length(tokenizer, prompt, completion) - max_length
    if excess <= 0:
        return prompt, False
    offsets = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    dropped = 0
    while excess > 0:
        dropped += excess
        if dropped >= len(offsets):
            raise DreamgymError(
                f"an example's completion alone is longer than max_length = {max_length} "
                f"tokens ({len(completion)} characters: {completion[:80]!r}...); raise "
                "the model's max_length (experience.max_length or policy.max_length) or shorten completions"
            )
        fitted = prompt[offsets[dropped][0] :]
        excess = _length(tokenizer, fitted, completion) - max_length
    return fitted, True


def fit_examples(
    examples: Sequence[dict[str, str]], tokenizer: PreTrainedTokenizerBase, max_length: int
) -> tuple[list[dict[str, str]], int]:
    """Examples that fit `max_length` (see `fit_example`), and how many were truncated."""
    fitted, truncated = [], 0
    for example in examples:
        prompt, cut = fit_example(example["prompt"], example["completion"], tokenizer, max_length)
        fitted.append({"prompt": prompt, "completion": example["completion"]})
        truncated += cut
    return fitted, truncated


def _check_examples(examples: Sequence[dict[str, str]], name: str) -> None:
    if not examples:
        raise DreamgymError(f"no {name} examples to train on; build examples from the buffer first")
    bad = [
        i
        for i, example in enumerate(examples)
        if not isinstance(example.get("prompt"), str) or not isinstance(example.get("completion"), str)
    ]
    if bad:
        raise DreamgymError(
            f"{len(bad)} {name} examples lack a 'prompt' or 'completion' string (first at index {bad[0]})"
        )


# --- the run directory ------------------------------------------------------------------------


def _digest(examples: Sequence[dict[str, str]] | None) -> str | None:
    if examples is None:
        return None
    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps([example["prompt"], example["completion"]]).encode("utf-8"))
    return digest.hexdigest()


def training_settings(config: ModelSettings) -> dict[str, Any]:
    """The settings that change what training produces: the model and training parts of the
    config. Generation and example-building settings are not among them (the latter are already
    reflected in the examples themselves), nor is the checkpoint interval."""
    return config_part(config, "model", "training")


def _run_identity(
    examples: Sequence[dict[str, str]], eval_examples: Sequence[dict[str, str]] | None, config: ModelSettings, seed: int
) -> dict[str, Any]:
    settings = training_settings(config)
    return {
        "examples": _digest(examples),
        "eval_examples": _digest(eval_examples),
        "settings": {**settings, "seed": seed},
    }


def claim_run_directory(output_dir: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """Record in `output_dir/run.json` which run the directory holds (a training or RL run's
    identity). Returns None when the directory is new or holds this run, else the identity it
    holds, for the caller to refuse with what differs."""
    path = output_dir / "run.json"
    if path.is_file():
        recorded = json.loads(path.read_text())
        return None if recorded == identity else recorded
    output_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(identity, indent=1))
    return None


def _claim_directory(output_dir: Path, identity: dict[str, Any]) -> None:
    """Record which training run the directory holds, or refuse if it holds another one."""
    recorded = claim_run_directory(output_dir, identity)
    if recorded is not None:
        changed = [key for key in ("examples", "eval_examples") if recorded.get(key) != identity[key]]
        changed += [
            key for key, value in identity["settings"].items() if recorded.get("settings", {}).get(key) != value
        ]
        raise DreamgymError(
            f"{output_dir} holds a training run with different {', '.join(changed)}; use another "
            "output directory, or pass resume=False to delete it and start afresh"
        )


def _clear_directory(output_dir: Path) -> None:
    for name in ("checkpoints", "model"):
        shutil.rmtree(output_dir / name, ignore_errors=True)
    (output_dir / "run.json").unlink(missing_ok=True)


def _finished_result(output_dir: Path) -> TrainResult | None:
    path = output_dir / "model" / RESULT_FILE
    if not path.is_file():
        return None
    result = TrainResult.from_json(path.read_text())
    return dataclasses.replace(result, model_dir=output_dir / "model", reused=True)


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The newest complete checkpoint: the Trainer writes trainer_state.json last, so a folder
    without it is a save that a crash interrupted."""
    complete = [
        path
        for path in checkpoints_dir.glob("checkpoint-*")
        if path.name.removeprefix("checkpoint-").isdigit() and (path / "trainer_state.json").is_file()
    ]
    return max(complete, key=lambda path: int(path.name.removeprefix("checkpoint-")), default=None)


def _checkpoint_step(checkpoint: Path | None) -> int | None:
    return None if checkpoint is None else int(checkpoint.name.removeprefix("checkpoint-"))


# --- model and trainer --------------------------------------------------------------------------


def _model_and_tokenizer(
    examples: Sequence[dict[str, str]], config: ModelSettings, seed: int, checkpoint: Path | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """From scratch, the tokenizer learns from the training examples only (the test split never
    leaks into the vocabulary); on resume it comes from the checkpoint, exactly as it was."""
    if config.model != FROM_SCRATCH:
        return load_pretrained(config.model)
    if checkpoint is not None:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(checkpoint)
    else:
        texts = (text for example in examples for text in (example["prompt"], example["completion"]))
        tokenizer = train_tokenizer(texts, config.vocab_size)
    return init_model(tokenizer, config, seed), tokenizer


def _sft_config(config: ModelSettings, output_dir: Path, seed: int, has_eval: bool, progress: bool) -> SFTConfig:
    """TRL settings. Some TRL defaults are wrong for us and set explicitly: bf16 (TRL turns it on
    even on CPU, where it is slow), activation checkpointing (TRL turns it on; a from-scratch
    model has memory to spare and it costs ~20% speed) and report_to (metrics go through our
    callback)."""
    from trl import SFTConfig  # slow import

    cuda = torch.cuda.is_available()
    return SFTConfig(
        output_dir=str(output_dir / "checkpoints"),
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=config.warmup_ratio,  # a float below 1 is a fraction of the steps
        max_length=config.max_length,
        completion_only_loss=True,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=2,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=config.save_steps,  # and at the last step: the final eval_loss
        logging_steps=LOGGING_FRACTION,
        logging_first_step=True,
        include_num_input_tokens_seen="non_padding",
        train_sampling_strategy="group_by_length",  # less padding: ~5-10% more tokens/s on CPU
        seed=seed,
        data_seed=seed,
        use_cpu=not cuda,
        bf16=cuda and torch.cuda.is_bf16_supported(),
        activation_checkpointing=config.model != FROM_SCRATCH,
        report_to="none",
        disable_tqdm=not progress,
    )


class _Throughput(TrainerCallback):
    """Tokens and seconds of this call's training loop (not of earlier sessions of a resumed run)."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.tokens, self.started = state.num_input_tokens_seen, time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        self.tokens = state.num_input_tokens_seen - self.tokens
        self.seconds = time.perf_counter() - self.started


class _MlflowMetrics(TrainerCallback):
    """Loss curves into the caller's active MLflow run. HF's own MLflowCallback is not used: it
    logs ~150 TrainingArguments/model-config params into the run (a clash with a param the flow
    logged raises), logs asynchronously, names the loss `loss`, and opens a run of its own in the
    Default experiment when none is active."""

    NAMES: ClassVar[dict[str, str]] = {
        "loss": "train_loss",
        "eval_loss": "eval_loss",
        "learning_rate": "learning_rate",
        "grad_norm": "grad_norm",
        "mean_token_accuracy": "train_token_accuracy",
        "eval_mean_token_accuracy": "eval_token_accuracy",
    }

    def on_log(self, args, state, control, logs=None, **kwargs):
        import mlflow  # slow import

        metrics = {name: float(logs[key]) for key, name in self.NAMES.items() if key in (logs or {})}
        if metrics:
            mlflow.log_metrics(metrics, step=state.global_step)


def _history(log_history: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) points; the final evaluation can repeat the last periodic one's step."""
    points = {int(entry["step"]): float(entry[key]) for entry in log_history if key in entry}
    return sorted(points.items())


@contextlib.contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """TRL's dataset preparation (`datasets`) and checkpoint writing (`transformers`) show their
    own progress bars; silence them on request and restore the previous setting afterwards."""
    import datasets  # slow import
    from transformers.utils import logging as transformers_logging

    switches = [
        (not datasets.are_progress_bars_disabled(), datasets.disable_progress_bars, datasets.enable_progress_bars),
        (
            transformers_logging.is_progress_bar_enabled(),
            transformers_logging.disable_progress_bar,
            transformers_logging.enable_progress_bar,
        ),
    ]
    if not enabled:
        for _, disable, _ in switches:
            disable()
    try:
        yield
    finally:
        for was_enabled, _, enable in switches:
            if was_enabled:
                enable()


def _require_active_mlflow_run() -> None:
    import mlflow  # slow import

    if mlflow.active_run() is None:
        raise DreamgymError(
            "log_to_mlflow=True needs an active MLflow run: call train_sft inside `with mlflow.start_run():`"
        )


def _log_summary(result: TrainResult) -> None:
    import mlflow  # slow import

    mlflow.log_metrics(
        {
            "train_seconds": result.seconds,
            "train_tokens_per_second": result.tokens_per_second,
            "truncated_examples": result.truncated,
            "parameters": result.parameters,
        },
        step=result.steps,
    )


def _write_result(result: TrainResult) -> None:
    """Written last and renamed into place: its presence marks the run as finished."""
    path = result.model_dir / RESULT_FILE
    partial = path.with_name(f".{RESULT_FILE}.partial")
    partial.write_text(result.to_json())
    partial.replace(path)


def _run_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_rows: list[dict[str, str]],
    eval_rows: list[dict[str, str]] | None,
    args: SFTConfig,
    checkpoint: Path | None,
    callbacks: list[TrainerCallback],
) -> SFTTrainer:
    """Build the SFTTrainer and train (from `checkpoint` if given); returns the trainer."""
    from datasets import Dataset  # slow import
    from trl import SFTTrainer  # slow import

    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(train_rows),
        eval_dataset=Dataset.from_list(eval_rows) if eval_rows else None,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    if args.disable_tqdm:  # with tqdm off the Trainer would print every log dict instead
        trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    return trainer


def train_sft(
    examples: Sequence[dict[str, str]],
    config: ModelSettings,
    output_dir: Path,
    seed: int,
    eval_examples: Sequence[dict[str, str]] | None = None,
    resume: bool = True,
    progress: bool = True,
    log_to_mlflow: bool = False,
    callbacks: Sequence[TrainerCallback] = (),
) -> TrainResult:
    """Train a causal LM with loss on the completions only; see the module docstring for
    the run directory, resume and truncation rules. `callbacks` are extra TrainerCallbacks (e.g. a
    UI, early stopping). With `log_to_mlflow`, metrics go to the caller's active MLflow run."""
    started = time.perf_counter()
    output_dir = Path(output_dir)
    eval_examples = eval_examples or None
    _check_examples(examples, "training")
    if eval_examples is not None:
        _check_examples(eval_examples, "evaluation")
    if log_to_mlflow:
        _require_active_mlflow_run()
    if not resume:
        _clear_directory(output_dir)
    _claim_directory(output_dir, _run_identity(examples, eval_examples, config, seed))
    finished = _finished_result(output_dir)
    if finished is not None:
        return finished
    deterministic_kernels()

    checkpoint = latest_checkpoint(output_dir / "checkpoints")
    model, tokenizer = _model_and_tokenizer(examples, config, seed, checkpoint)
    train_rows, truncated = fit_examples(examples, tokenizer, config.max_length)
    eval_rows = fit_examples(eval_examples, tokenizer, config.max_length)[0] if eval_examples else None
    throughput = _Throughput()
    extra = [_MlflowMetrics()] if log_to_mlflow else []
    with progress_bars(progress):
        args = _sft_config(config, output_dir, seed, eval_rows is not None, progress)
        trainer = _run_trainer(
            model, tokenizer, train_rows, eval_rows, args, checkpoint, [throughput, *extra, *callbacks]
        )
        model_dir = save_model(trainer.model, tokenizer, output_dir / "model")

    eval_losses = _history(trainer.state.log_history, "eval_loss")
    result = TrainResult(
        model_dir=model_dir,
        steps=trainer.state.global_step,
        epochs=float(trainer.state.epoch or 0.0),
        train_losses=_history(trainer.state.log_history, "loss"),
        eval_losses=eval_losses,
        eval_loss=eval_losses[-1][1] if eval_losses else None,
        seconds=time.perf_counter() - started,
        tokens_per_second=throughput.tokens / max(throughput.seconds, 1e-9),
        truncated=truncated,
        parameters=sum(parameter.numel() for parameter in trainer.model.parameters()),
        resumed_from=_checkpoint_step(checkpoint),
    )
    _write_result(result)
    if log_to_mlflow:
        _log_summary(result)
    return result


def plot_losses(result: TrainResult, path: str | Path) -> Path:
    """A PNG of the loss curves, to log as an artifact beside the numbers. Uses the Agg canvas
    directly, so no GUI backend or pyplot global state is involved."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # slow import
    from matplotlib.figure import Figure

    path = Path(path)
    figure = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, points, style in (("train", result.train_losses, "-"), ("eval", result.eval_losses, "o-")):
        if points:
            steps, losses = zip(*points, strict=True)
            axes.plot(steps, losses, style, label=label)
    axes.set(
        xlabel="step",
        ylabel="loss (completion tokens)",
        yscale="log",
        title=f"SFT: {result.parameters / 1e6:.1f}M parameters, {result.steps} steps",
    )
    axes.grid(alpha=0.3)
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path
