"""The experience model's tokenizer, tiny Llama and TRL SFT training, on real TextWorld transitions.

The real example builder lives elsewhere; here a simple prompt (task, state, action) and completion
(reward, the lines of the state that changed) stand in for it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import mlflow
import pytest
import torch
from transformers import TrainerCallback

from dreamgym.data.schema import read_transitions
from dreamgym.errors import DreamgymError
from dreamgym.experience.config import ExperienceConfig
from dreamgym.lm.model import (
    device_and_dtype,
    init_model,
    load_model,
    load_pretrained,
    train_tokenizer,
)
from dreamgym.lm.sft import (
    TrainResult,
    fit_example,
    fit_examples,
    latest_checkpoint,
    plot_losses,
    train_sft,
)

TINY = ExperienceConfig(
    vocab_size=512,
    hidden_size=64,
    layers=2,
    heads=2,
    max_length=256,
    epochs=2,
    batch_size=8,
    learning_rate=3e-3,
    save_steps=10,
)


def _items(state: str) -> dict[str, set[str]]:
    fields = dict(line.split(":", 1) for line in state.splitlines() if ":" in line)
    return {
        key: {item.strip() for item in value.split(";") if item.strip()}
        for key, value in fields.items()
        if key != "actions"
    }


def _example(row: dict) -> dict[str, str]:
    """Prompt: task, state, action. Completion: the reward and what appeared or disappeared."""
    before, after = _items(row["state"]), _items(row["next_state"])
    delta = [
        f"{sign} {key}: {item}"
        for key in sorted(after.keys() | before.keys())
        for sign, items in (
            ("+", after.get(key, set()) - before.get(key, set())),
            ("-", before.get(key, set()) - after.get(key, set())),
        )
        for item in sorted(items)
    ]
    return {
        "prompt": f"Task: {row['instruction']}\nState:\n{row['state']}\nAction: {row['action']}\n",
        "completion": "\n".join([f"Reward: {row['reward']:g}", *delta, f"Done: {row['terminated']}"]) + "\n",
    }


@pytest.fixture(scope="module")
def split(offline_dataset) -> tuple[list[dict], list[dict]]:
    """Training and held-out examples, split by trajectory (4 held out) as the pipeline would."""
    rows = read_transitions(offline_dataset).to_pylist()
    held_out = sorted({row["trajectory_id"] for row in rows})[:4]
    train = [_example(row) for row in rows if row["trajectory_id"] not in held_out]
    test = [_example(row) for row in rows if row["trajectory_id"] in held_out]
    return train, test


@pytest.fixture(scope="module")
def tokenizer(split):
    train, _ = split
    return train_tokenizer((text for ex in train for text in (ex["prompt"], ex["completion"])), 512)


def _texts(examples: list[dict]) -> list[str]:
    return [text for ex in examples for text in (ex["prompt"], ex["completion"])]


def test_tokenizer_round_trips_and_marks_sequences(split, tokenizer):
    train, test = split
    for text in [*_texts(train), *_texts(test), "café – naïve ✓ \t tabs\n\n  spaces  . , !"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    assert tokenizer("take knife")["input_ids"][0] == tokenizer.bos_token_id
    assert tokenizer.padding_side == "left"
    # The environment's phrases are learned: far fewer tokens than bytes.
    prompt = train[0]["prompt"]
    assert len(tokenizer(prompt)["input_ids"]) < len(prompt.encode()) / 3


def test_truncation_keeps_the_completion_and_the_end_of_the_prompt(split, tokenizer):
    train, _ = split
    fitted, truncated = fit_examples(train, tokenizer, 160)
    assert 0 < truncated <= len(train)
    for original, example in zip(train, fitted, strict=True):
        assert example["completion"] == original["completion"]
        assert original["prompt"].endswith(example["prompt"])
        sequence = example["prompt"] + example["completion"] + tokenizer.eos_token
        assert len(tokenizer(sequence)["input_ids"]) <= 160
    assert sum(ex["prompt"] != orig["prompt"] for ex, orig in zip(fitted, train)) == truncated
    short = {"prompt": "Action: look\n", "completion": "Reward: 0\n"}
    assert fit_example(short["prompt"], short["completion"], tokenizer, 160) == (short["prompt"], False)
    with pytest.raises(DreamgymError, match=r"completion alone is longer than max_length"):
        fit_example("Action: look\n", "Reward: 0\n" * 100, tokenizer, 64)


def test_trl_trains_on_the_whole_completion_only(split, tokenizer):
    """What TRL makes of a truncated example: every completion token (and EOS) is a label, no
    prompt token is, and the sequence fits max_length."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    train, _ = split
    fitted, _ = fit_examples(train[:16], tokenizer, 160)
    model = init_model(tokenizer, TINY, seed=0)
    args = SFTConfig(
        output_dir="unused",
        max_length=160,
        completion_only_loss=True,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(fitted), processing_class=tokenizer)
    for example, row in zip(fitted, trainer.train_dataset, strict=True):
        labels = [label for label in row["labels"] if label != -100]
        assert tokenizer.decode(labels) == example["completion"] + tokenizer.eos_token
        assert len(row["input_ids"]) <= 160


@pytest.fixture(scope="module")
def trained(split, tmp_path_factory) -> tuple[TrainResult, dict[str, list], Path]:
    """One tiny model trained on the training split inside an MLflow run of a private store:
    (result, its MLflow metric histories, run directory)."""
    train, test = split
    root = tmp_path_factory.mktemp("trained")
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    try:
        with mlflow.start_run() as run:
            result = train_sft(
                train, TINY, root / "run", seed=0, eval_examples=test, progress=False, log_to_mlflow=True
            )
        history = {
            name: mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, name)
            for name in ("train_loss", "eval_loss")
        }
    finally:
        mlflow.set_tracking_uri(None)
    return result, history, root / "run"


def test_training_loss_falls_and_the_weights_change(split, trained):
    train, _ = split
    result, _, _ = trained
    first = sum(loss for _, loss in result.train_losses[:3]) / 3
    last = sum(loss for _, loss in result.train_losses[-3:]) / 3
    assert last < 0.7 * first, result.train_losses
    assert result.eval_loss == result.eval_losses[-1][1] < result.eval_losses[0][1]
    assert result.steps == 2 * -(-len(train) // TINY.batch_size) and result.epochs == pytest.approx(2)
    assert result.truncated == fit_examples(train, train_tokenizer(_texts(train), 512), 256)[1] > 0
    assert result.tokens_per_second > 0 and result.resumed_from is None and not result.reused

    # The saved tokenizer is the one learned from the training examples alone.
    model, tokenizer = load_model(result.model_dir)
    assert tokenizer.get_vocab() == train_tokenizer(_texts(train), 512).get_vocab()
    initial = init_model(tokenizer, TINY, seed=0)
    assert result.parameters == sum(p.numel() for p in initial.parameters())
    trained_weights = dict(model.named_parameters())
    assert all(not torch.equal(trained_weights[name], value) for name, value in initial.named_parameters())


def test_losses_go_to_mlflow_and_a_plot(trained, tmp_path):
    result, history, _ = trained
    assert [(m.step, pytest.approx(m.value)) for m in history["train_loss"]] == result.train_losses
    assert [m.step for m in history["eval_loss"]] == [step for step, _ in result.eval_losses]
    assert plot_losses(result, tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_a_finished_run_is_reused_not_retrained(split, trained):
    train, test = split
    result, _, run_dir = trained
    weights = result.model_dir / "model.safetensors"
    written = weights.stat().st_mtime_ns
    started = time.perf_counter()
    again = train_sft(train, TINY, run_dir, seed=0, eval_examples=test, progress=False)
    assert again.reused and time.perf_counter() - started < 5
    assert again.train_losses == result.train_losses and weights.stat().st_mtime_ns == written
    assert TrainResult.from_json(again.to_json()) == again


def test_batched_left_padded_generation_matches_one_by_one(split, trained):
    """The pad token and left padding are right for batched generation: same greedy output."""
    model, tokenizer = load_model(trained[0].model_dir)
    prompts = [example["prompt"][-400:] for example in split[1][:4]]
    prompts[1] = prompts[1][-150:]  # different lengths, so that padding happens

    def generate(texts: list[str]) -> list[str]:
        batch = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)
        output = model.generate(**batch, max_new_tokens=12, do_sample=False)
        return tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)

    assert generate(prompts) == [generate([prompt])[0] for prompt in prompts]


class _CrashAt(TrainerCallback):
    """A simulated crash in the middle of training."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError("simulated crash")


class _FirstStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        self.first = getattr(self, "first", state.global_step)


def test_a_crashed_run_resumes_from_its_last_checkpoint(split, tmp_path):
    train, _ = split
    examples = train[:32]  # 8 steps an epoch, 16 in all
    config = dataclasses.replace(TINY, save_steps=3, batch_size=4, max_length=128)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_sft(examples, config, tmp_path / "run", seed=0, progress=False, callbacks=[_CrashAt(8)])
    checkpoint = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert checkpoint is not None and checkpoint.name == "checkpoint-6"

    first = _FirstStep()
    resumed = train_sft(examples, config, tmp_path / "run", seed=0, progress=False, callbacks=[first])
    assert resumed.resumed_from == 6 and first.first == 7 and resumed.steps == 16
    assert [step for step, _ in resumed.train_losses] == list(range(1, 17))  # history kept across the crash

    # The checkpoint's weights, optimizer, schedule and data order were restored: the result is the
    # same as an uninterrupted run's.
    straight = train_sft(examples, config, tmp_path / "straight", seed=0, progress=False)
    resumed_model, _ = load_model(resumed.model_dir)
    straight_model, _ = load_model(straight.model_dir)
    for (name, value), other in zip(resumed_model.named_parameters(), straight_model.parameters()):
        torch.testing.assert_close(value, other, msg=name)

    # Another run's directory is refused, unless the caller asks to start over.
    longer = dataclasses.replace(config, epochs=3)
    with pytest.raises(DreamgymError, match="different epochs"):
        train_sft(examples, longer, tmp_path / "run", seed=0, progress=False)


def test_missing_models_and_mlflow_runs_give_clear_errors(split, tmp_path):
    with pytest.raises(DreamgymError, match=r"cannot be loaded from local files.*from_scratch"):
        load_pretrained("no-such-org/no-such-model")
    config = dataclasses.replace(TINY, model=str(tmp_path / "missing"))
    with pytest.raises(DreamgymError, match="cannot be loaded from local files"):
        train_sft(split[0], config, tmp_path / "pretrained", seed=0, progress=False)
    with pytest.raises(DreamgymError, match="no saved model"):
        load_model(tmp_path)
    with pytest.raises(DreamgymError, match="active MLflow run"):
        train_sft(split[0], TINY, tmp_path / "run", seed=0, progress=False, log_to_mlflow=True)
    with pytest.raises(DreamgymError, match="no training examples"):
        train_sft([], TINY, tmp_path / "run", seed=0, progress=False)


def test_device_and_dtype_follow_the_hardware():
    device, dtype = device_and_dtype()
    if torch.cuda.is_available():
        assert device.type == "cuda" and dtype in (torch.bfloat16, torch.float32)
    else:
        assert (device.type, dtype) == ("cpu", torch.float32)
