"""The experience model at work: predict next state, reward and done for many transitions at once.

`ExperienceModel.predict` takes a batch of (task, history, state, action) queries, retrieves each
one's worked examples from the buffer in one batched query, writes the prompts, generates all
completions in one batched `generate` call (KV cache on, left padding), and parses them. A
completion that does not parse is generated again by sampling (a different draw each retry); one
that still does not parse comes back as an explicit failure with the parser's reason — never as a
made-up state or a zero reward.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from dreamgym.config import ExperienceConfig, PipelineConfig
from dreamgym.experience.examples import worked_examples
from dreamgym.experience.format import (Completion, FormatError, Step, Worked, format_prompt,
                                        parse_completion)
from dreamgym.state import AbstractState

# Generation stops at the end of the completion's last section, whatever follows in the vocabulary.
STOP = "</done>"
RETRY_TEMPERATURE = 0.8
SETTINGS_FILE = "experience.json"  # beside the weights: the prompt shape the model was trained on
# Settings that shape a prompt or completion: a model must be used with the ones it learned.
TRAINED_SHAPE = ("history", "neighbours", "reasoning")


def save_settings(model_dir: str | Path, config: ExperienceConfig) -> None:
    (Path(model_dir) / SETTINGS_FILE).write_text(json.dumps(dataclasses.asdict(config), indent=2))


def trained_settings(model_dir: str | Path, current: ExperienceConfig) -> ExperienceConfig:
    """`current`, with the prompt shape the model in `model_dir` was trained with."""
    path = Path(model_dir) / SETTINGS_FILE
    if not path.is_file():
        return current
    trained = json.loads(path.read_text())
    return dataclasses.replace(current, **{key: trained[key] for key in TRAINED_SHAPE})


@dataclass(frozen=True)
class Query:
    instruction: str
    state: AbstractState
    action: str
    history: tuple[Step, ...] = ()
    trajectory_id: str | None = None  # its own trajectory is never retrieved


@dataclass(frozen=True)
class Prediction:
    completion: Completion | None  # None: no attempt parsed
    text: str                      # the last generated completion text
    attempts: int
    error: str | None = None       # why the last attempt did not parse

    @property
    def ok(self) -> bool:
        return self.completion is not None


class ExperienceModel:
    """A trained experience model with its retrieval memory; an environment's dynamics as an LM."""

    def __init__(self, model, tokenizer, config: ExperienceConfig, database=None, encoder=None,
                 ef_search: int = 80, seed: int = 0):
        if config.neighbours and (database is None or encoder is None):
            raise ValueError("retrieval is on (experience.neighbours > 0): give a buffer database "
                             "and an encoder, or set experience.neighbours: 0")
        self.model, self.tokenizer, self.config = model.eval(), tokenizer, config
        self.database, self.encoder, self.ef_search, self.seed = database, encoder, ef_search, seed
        self.tokenizer.padding_side = "left"  # batched generation continues every prompt at its end
        self.tokenizer.truncation_side = "left"  # the state and action sit at the prompt's end

    def worked(self, queries: Sequence[Query]) -> list[list[Worked]]:
        if not self.config.neighbours:
            return [[] for _ in queries]
        return worked_examples(self.database, self.encoder,
                               [{"instruction": q.instruction, "state": q.state, "action": q.action,
                                 "trajectory_id": q.trajectory_id} for q in queries],
                               self.config.neighbours, self.ef_search)

    def prompts(self, queries: Sequence[Query]) -> list[str]:
        return [format_prompt(q.instruction, q.history, q.state, q.action, worked)
                for q, worked in zip(queries, self.worked(queries))]

    @torch.inference_mode()
    def generate(self, prompts: Sequence[str], sample: bool = False, attempt: int = 0) -> list[str]:
        """Completions of `prompts` in one batched call: greedy, or sampled for a retry."""
        budget = self.config.max_length - self.config.max_new_tokens
        inputs = self.tokenizer(list(prompts), return_tensors="pt", padding=True, truncation=True,
                                max_length=budget).to(self.model.device)
        if sample:
            torch.manual_seed(self.seed + attempt)
        output = self.model.generate(
            **inputs, max_new_tokens=self.config.max_new_tokens, do_sample=sample,
            temperature=RETRY_TEMPERATURE if sample else None, top_p=None, top_k=None,
            use_cache=True, stop_strings=[STOP], tokenizer=self.tokenizer,
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id)
        texts = self.tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        # A batch row that stopped early is padded after its stop string; cut there.
        return [text[:text.index(STOP) + len(STOP)] if STOP in text else text for text in texts]

    def predict(self, queries: Sequence[Query]) -> list[Prediction]:
        prompts = self.prompts(queries)
        results: list[Prediction | None] = [None] * len(queries)
        pending = list(range(len(queries)))
        for attempt in range(self.config.retries + 1):
            texts = self.generate([prompts[i] for i in pending], sample=attempt > 0, attempt=attempt)
            still = []
            for index, text in zip(pending, texts):
                try:
                    completion = parse_completion(text, queries[index].state, self.config.reasoning)
                    results[index] = Prediction(completion, text, attempt + 1)
                except FormatError as error:
                    results[index] = Prediction(None, text, attempt + 1, str(error))
                    still.append(index)
            pending = still
            if not pending:
                break
        return results  # type: ignore[return-value] - every slot was filled by the first attempt


@contextmanager
def open_experience_model(model_dir: str | Path, run_dir: str | Path,
                          config: PipelineConfig) -> Iterator[ExperienceModel]:
    """The model in `model_dir` with its buffer and encoder, ready to predict."""
    from dreamgym.buffer.embeddings import Encoder  # noqa: PLC0415 - heavy imports, needed here only
    from dreamgym.buffer.migrations import open_migrated  # noqa: PLC0415
    from dreamgym.experience.model import load_experience_model  # noqa: PLC0415

    settings = trained_settings(model_dir, config.experience)
    model, tokenizer = load_experience_model(model_dir)
    if not settings.neighbours:
        yield ExperienceModel(model, tokenizer, settings, seed=config.seed)
        return
    with open_migrated(run_dir, config.buffer) as database:
        yield ExperienceModel(model, tokenizer, settings, database, Encoder(config.buffer.encoder),
                              config.buffer.ef_search, config.seed)
