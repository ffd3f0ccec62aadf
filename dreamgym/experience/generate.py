"""The experience model at work: predict next state, reward and done for many transitions at once.

`ExperienceModel.predict` takes a batch of (task, history, state, action) queries, retrieves each
one's worked examples from the buffer in one batched query, writes the prompts, generates all
completions batched (KV cache on, left padding; rows that finished leave the batch as it goes on),
and parses them. A greedy completion is first guessed and checked, and only where the model
differs decoded (`decoding.py`: the same tokens, faster). A completion that does not parse is
generated again by sampling (a different draw each retry; a batch's retries together, each row
drawn from its own generator seeded by its prompt, `SeededSampling`); one that still does not parse
comes back as an explicit failure with the parser's reason — never as a made-up state or a zero
reward.

`RemoteExperienceModel` (experience.backend: http, `remote.py`) generates on an OpenAI-compatible
server instead; retrieval, prompts, parsing and retries are this module's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import StoppingCriteriaList, StopStringCriteria

from dreamgym.config import PipelineConfig
from dreamgym.domain import named_domain
from dreamgym.envs.dynamics import Dynamics, Prediction, Query, Step
from dreamgym.errors import DreamgymError
from dreamgym.experience.affordances import AFFORDANCES_FILE, Affordances
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.constrain import DeltaConstraint
from dreamgym.experience.decoding import (
    RETRY_TEMPERATURE,
    STOP,
    DraftDecoding,
    Rules,
    SeededSampling,
    copied_completion,
    ended_at_stop,
    sample_seed,
)
from dreamgym.experience.examples import adapted_examples, neighbours, to_worked, traces_examples
from dreamgym.experience.format import (
    FORMAT_VERSION,
    FormatError,
    example_changes,
    example_traces,
    format_prompt,
    parse_completion,
    with_real_names,
)
from dreamgym.experience.places import RememberedPlaces
from dreamgym.placeholders import Placeholders, shown_names
from dreamgym.sections import config_part
from dreamgym.state import AbstractState, whole_word

# A KV cache allocated once for prompt + max_new_tokens, not one that grows (and is copied) at every
# step: the same tokens, 2.6x faster at batch 32 on a CPU. transformers compiles a static cache's
# forward pass for every new batch shape, and ours change at every call: generate is called with
# disable_compile (measured on an H200: results log, 2026-11-27).
CACHE = "static"
# A batch decodes until its longest completion ends (in a DreamEnv batch of 32 the mean is ~45
# tokens, the longest ~135), so every COMPACT_AFTER new tokens the rows still writing go on alone,
# prefilled again, with the same greedy tokens (the best interval measured: results log, 2026-11-27).
COMPACT_AFTER = 48
# On a CPU a batch of more rows than this that failed their drafts is decoded together, fewer are
# speculated one by one (`speculated`; on a GPU only a row alone is): results log, 2026-11-30.
SPECULATED_ROWS = 4
SETTINGS_FILE = "experience.json"  # beside the weights: the prompt shape the model was trained on
# Settings that shape a prompt or completion: a model must be used with the ones it learned.


class ExperienceFormatError(DreamgymError):
    """A trained model whose prompts had another shape than the ones this code writes."""


class ExperienceBackendError(DreamgymError):
    """An experience-model server that cannot be reached or gives no usable completions."""


def save_settings(model_dir: str | Path, config: ExperienceConfig, kept_names: frozenset[str] | None = None) -> None:
    """The settings beside the weights, with the kept names of the model's placeholders."""
    if config.placeholders and kept_names is None:
        raise ValueError("a model trained with placeholders needs its kept names saved with it")
    settings = dataclasses.asdict(config) | {
        "kept_names": sorted(kept_names) if config.placeholders else None,
        "format": FORMAT_VERSION,
    }
    (Path(model_dir) / SETTINGS_FILE).write_text(json.dumps(settings, indent=2))


def trained_kept_names(model_dir: str | Path) -> frozenset[str] | None:
    """The names the model in `model_dir` was shown as they are (None: it has no placeholders)."""
    path = Path(model_dir) / SETTINGS_FILE
    kept = json.loads(path.read_text()).get("kept_names") if path.is_file() else None
    return None if kept is None else frozenset(kept)


def trained_settings(model_dir: str | Path, current: ExperienceConfig) -> ExperienceConfig:
    """`current`, with the prompt shape the model in `model_dir` was trained with."""
    path = Path(model_dir) / SETTINGS_FILE
    if not path.is_file():
        return current
    trained = json.loads(path.read_text())
    if trained.get("format", 2) != FORMAT_VERSION:  # saved before the version was: 2
        raise ExperienceFormatError(
            f"the experience model in {Path(model_dir).parent} was trained on prompt format "
            f"{trained.get('format', 2)}, and this dreamgym writes format {FORMAT_VERSION} "
            "(experience/format.py): train it again with dreamgym run"
        )
    # A model saved before placeholders existed was trained without them.
    trained.setdefault("placeholders", False)
    trained.setdefault("retrieval_pool", 0)  # and saw neighbours in the embedding's order
    trained.setdefault("ranking_off", [])  # every ranking key on
    trained.setdefault("domain", "textworld-cooking")  # the only rules there were
    trained.setdefault("copy_examples", False)  # and wrote every change out
    trained.setdefault("learnt_actions", False)  # and showed every example's change as it is
    trained.setdefault("annotator", "state-diff")  # the only one there was
    trained.setdefault("annotator_url", "")
    trained.setdefault("annotator_model", "")
    return dataclasses.replace(current, **{key: trained[key] for key in config_part(current, "prompt")})


class ExperienceModel(DraftDecoding):
    """A trained experience model with its retrieval memory; an environment's dynamics as an LM."""

    def __init__(
        self,
        model,
        tokenizer,
        config: ExperienceConfig,
        database=None,
        encoder=None,
        ef_search: int = 80,
        seed: int = 0,
        kept_names: frozenset[str] | None = None,
        affordances: Affordances | None = None,
    ):
        if config.neighbours and (database is None or encoder is None):
            raise ValueError(
                "retrieval is on (experience.neighbours > 0): give a buffer database "
                "and an encoder, or set experience.neighbours: 0"
            )
        if config.placeholders and kept_names is None:
            raise ValueError(
                "this model shows objects as placeholders (experience.placeholders): "
                "give the kept names it was trained with (trained_kept_names(model_dir))"
            )
        if config.adapts_examples and affordances is None:
            raise ValueError(
                "this model was trained with experience.learnt_actions: give the affordances saved "
                "beside it (affordances.Affordances.load)"
            )
        self.kept_names = kept_names if config.placeholders else None
        self.affordances = affordances if config.adapts_examples else None
        self.domain = named_domain(config.domain)
        self.model = model.eval() if model is not None else None  # None: a remote model
        self.tokenizer, self.config = tokenizer, config
        self.database, self.encoder, self.ef_search, self.seed = database, encoder, ef_search, seed
        self._dynamics: Dynamics | None = None  # this model with its rule layers (`dynamics`)
        if tokenizer is not None:
            self.tokenizer.padding_side = "left"  # batched generation continues every prompt at its end
            self.tokenizer.truncation_side = "left"  # the state and action sit at the prompt's end

    def retrieved(self, queries: Sequence[Query]) -> list[list[dict]]:
        """Each query's neighbour transitions from the buffer, most similar first."""
        return neighbours(
            self.database,
            self.encoder,
            [
                {
                    "instruction": q.instruction,
                    "state": q.state,
                    "action": q.action,
                    "trajectory_id": q.trajectory_id,
                    "score_before": q.score,
                }
                for q in queries
            ],
            self.config.neighbours,
            self.ef_search,
            synthetic=self.config.synthetic_neighbours,
            pool=self.config.retrieval_pool,
            kept=self.kept_names,
            ranking_off=self.config.ranking_off,
            domain=self.domain,
        )

    def framed(self, queries: Sequence[Query]) -> list[tuple[str, Query, Placeholders]]:
        """Each query as the model sees it: its prompt, the query in the prompt's names (its
        state is what the completion changes) and the placeholders that lead back to real names."""
        framed = []
        for query, found in zip(queries, self.retrieved(queries)):
            names = Placeholders({})
            if self.kept_names is not None:
                names = Placeholders.of(self.kept_names, query.action, [query.state], self.imagined_names(query))
                query = _renamed(query, names)
                found = [Placeholders.own(self.kept_names, row) for row in found]
            traced = traces_examples(self.config)
            worked = (
                adapted_examples(
                    found, query.state, query.action, names, self.affordances, traced, query.instruction, self.domain
                )
                if self.affordances is not None
                else [to_worked(row, traced) for row in found]
            )
            prompt = format_prompt(query.instruction, query.history, query.state, query.action, worked)
            framed.append((prompt, query, names))
        return framed

    def imagined_names(self, query: Query) -> tuple[str, ...]:
        """The objects the task asks for that neither the query's state nor its history shows, in
        the task's order: the names of the objects the model imagines (dreamgym/placeholders.py)."""
        if not self.config.name_imagined:
            return ()
        shown = set(shown_names(query.state))
        return tuple(
            name
            for name in self.domain.task_objects(query.instruction)
            if name not in shown and not any(whole_word(name).search(step.action) for step in query.history)
        )

    def prompts(self, queries: Sequence[Query]) -> list[str]:
        return [prompt for prompt, _, _ in self.framed(queries)]

    def encode(self, prompts: Sequence[str]):
        """The prompts as one left-padded batch of token ids, each cut from the left to leave room
        for `max_new_tokens`."""
        budget = self.config.max_length - self.config.max_new_tokens
        return self.tokenizer(list(prompts), return_tensors="pt", padding=True, truncation=True, max_length=budget).to(
            self.model.device
        )

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[str],
        sample: bool = False,
        attempt: int = 0,
        states: Sequence[AbstractState] | None = None,
        changes: Sequence[Sequence[str]] | None = None,
        traces: Sequence[Sequence[str | None]] | None = None,
    ) -> list[str]:
        """Completions of `prompts`, batched: greedy, or sampled for a retry. With the prompts'
        current `states` (and experience.constrained_decoding), a removal can only name an item
        the state has, an addition cannot repeat one, a reference can only name a worked example
        whose change (`changes`: each prompt's `example_changes`) fits the state, and the reward
        and done are those the reasoning stated, itself or by naming an example (`traces`: each
        prompt's `example_traces`; `constrain.py`). Greedy rows whose copy of their first worked
        example is what the model writes (`checked_drafts`) are not decoded; a few others are
        decoded one by one from where their draft failed, speculatively (`speculated`); more are
        decoded as a batch, where every `COMPACT_AFTER` new tokens the rows still writing go on
        without the finished ones."""
        checked: list[str | list[int] | None] = [None] * len(prompts)
        if not sample and self._drafts_checkable():
            checked = self.checked_drafts(prompts, states, changes, traces)
        texts = [text if isinstance(text, str) else None for text in checked]
        rest = [index for index, text in enumerate(texts) if text is None]
        alone = SPECULATED_ROWS if self.model.device.type == "cpu" else 1
        if rest and len(rest) <= alone and self._rules_alone():
            for index in rest:
                known = checked[index]
                texts[index] = self.speculated(
                    prompts[index],
                    known if isinstance(known, list) else [],
                    _picked(states, [index]),
                    _picked(changes, [index]),
                    _picked(traces, [index]),
                    sample=sample,
                    attempt=attempt,
                )
        elif rest:
            decoded = self._decode(
                [prompts[i] for i in rest],
                sample,
                attempt,
                _picked(states, rest),
                _picked(changes, rest),
                _picked(traces, rest),
            )
            for index, text in zip(rest, decoded):
                texts[index] = text
        return texts  # type: ignore[return-value] - every slot is filled

    def _decode(
        self,
        prompts: Sequence[str],
        sample: bool,
        attempt: int,
        states: Sequence[AbstractState] | None,
        changes: Sequence[Sequence[str]] | None,
        traces: Sequence[Sequence[str | None]] | None,
    ) -> list[str]:
        """Completions written token by token (`generate`)."""
        inputs = self.encode(prompts)
        # A sampled prompt's own generator, which goes on with it through compaction.
        generators = [
            torch.Generator(self.model.device).manual_seed(sample_seed(self.seed, attempt, [prompt]))
            for prompt in (prompts if sample else ())
        ]
        start = inputs["input_ids"].shape[1]  # where every row's completion begins (left padding)
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        rows = list(range(len(prompts)))  # the prompt of each row of the batch
        texts = [""] * len(prompts)
        written = 0
        while rows:
            left = self.config.max_new_tokens - written
            rules = self._constraints(rows, start, states, changes, traces, sample)
            if sample:
                rules.append(SeededSampling([generators[row] for row in rows], RETRY_TEMPERATURE))
            output = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                logits_processor=rules,
                max_new_tokens=min(left, COMPACT_AFTER) if len(rows) > 1 else left,
                do_sample=False,  # a sample is drawn by SeededSampling, and taken as the argmax
                temperature=None,
                top_p=None,
                top_k=None,
                use_cache=True,
                cache_implementation=CACHE,
                disable_compile=True,
                stopping_criteria=self._stop_at_end,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
            )
            new = output[:, ids.shape[1] :]
            written += new.shape[1]
            going = []
            for index, text in enumerate(self.tokenizer.batch_decode(output[:, start:], skip_special_tokens=True)):
                texts[rows[index]] = text
                ended = STOP in text or bool((new[index] == self.tokenizer.eos_token_id).any())
                if not ended and written < self.config.max_new_tokens:
                    going.append(index)
            # A row going on has no padding among its new tokens: it has not stopped.
            rows, ids = [rows[index] for index in going], output[going]
            mask = torch.cat([mask[going], mask.new_ones(len(going), new.shape[1])], dim=1)
        return [ended_at_stop(text) for text in texts]

    @functools.cached_property
    def _stop_at_end(self) -> StoppingCriteriaList:
        """Stop at STOP, built once: transformers would build it again (its token tables included)
        at every `generate` call."""
        return StoppingCriteriaList([StopStringCriteria(self.tokenizer, [STOP])])

    def _constraints(
        self,
        rows: Sequence[int],
        start: int,
        states: Sequence[AbstractState] | None,
        changes: Sequence[Sequence[str]] | None,
        traces: Sequence[Sequence[str | None]] | None,
        sample: bool,
    ) -> Rules:
        """The decoding rules for the batch rows `rows` (indices into the prompts), whose
        completions begin at column `start` and are sampled or greedy."""
        if states is None or not self.config.constrained_decoding:
            return Rules()
        stated = traces_examples(self.config)  # state-diff traces state the reward and the end
        return Rules(
            [
                DeltaConstraint(
                    self.tokenizer,
                    _picked(states, rows),
                    start,
                    _picked(changes, rows),
                    stated,
                    _picked(traces, rows),
                    reasoning=self.config.reasoning,
                    greedy=not sample,
                )
            ]
        )

    def dynamics(self) -> Dynamics:
        """This model with its rule layers over it, as DreamEnv and the fidelity evaluation use
        it: the memory of places (experience.remember_places, places.py) where it is on and the
        model shows its examples with learnt actions. The same object at every call: DreamEnvs
        that step together must share one model."""
        if self._dynamics is None:
            layered = self.config.remember_places and self.affordances is not None
            self._dynamics = RememberedPlaces(self, self.affordances) if layered else self
        return self._dynamics

    @property
    def history(self) -> int:
        """Earlier steps of the episode a query carries (DreamEnv's `Dynamics`)."""
        return self.config.history

    def predict(self, queries: Sequence[Query]) -> list[Prediction]:
        """The predicted step of each query, in its real names (`Prediction.text` is what the
        model wrote, in the prompt's). A prompt that several queries share is written once: a GRPO
        group's rollouts start from one state and often take the same first moves, and what the
        model writes depends on nothing but the prompt (greedy, or sampled with a seed of it)."""
        framed = self.framed(queries)
        prompts = [prompt for prompt, _, _ in framed]
        queries = [shown for _, shown, _ in framed]
        shown_changes = [example_changes(prompt) for prompt in prompts]  # what a reference names
        shown_traces = [example_traces(prompt) for prompt in prompts]
        results: list[Prediction | None] = [None] * len(queries)
        pending = list(range(len(queries)))
        for attempt in range(self.config.retries + 1):
            first: dict[str, int] = {}
            for index in pending:
                first.setdefault(prompts[index], index)
            asked = list(first.values())  # the first query of each prompt
            # Greedy first, then sampled, each row with its own seed: the same text whatever else
            # is in the batch.
            written = self.generate(
                [prompts[i] for i in asked],
                sample=attempt > 0,
                attempt=attempt,
                states=[queries[i].state for i in asked],
                changes=[shown_changes[i] for i in asked],
                traces=[shown_traces[i] for i in asked],
            )
            text_of = {prompts[i]: text for i, text in zip(asked, written)}
            still = []
            for index in pending:
                text = text_of[prompts[index]]
                try:  # in this query's real names: one prompt in placeholders can stand for several
                    completion = parse_completion(
                        text, queries[index].state, self.config.reasoning, shown_changes[index], shown_traces[index]
                    )
                    completion = with_real_names(completion, framed[index][2])
                    results[index] = Prediction(completion, text, attempt + 1)
                except FormatError as error:
                    results[index] = Prediction(None, text, attempt + 1, str(error))
                    still.append(index)
            pending = still
            if not pending:
                break
        return results  # type: ignore[return-value] - every slot was filled by the first attempt


def _renamed(query: Query, names: Placeholders) -> Query:
    rename = names.forward.text
    return dataclasses.replace(
        query,
        instruction=rename(query.instruction),
        action=rename(query.action),
        state=names.forward.abstract(query.state),
        history=tuple(Step(rename(step.action), step.reward, rename(step.location)) for step in query.history),
    )


class NeighbourCopy(ExperienceModel):
    """No model at all, for the ablation that shows what the LM adds: each query's first worked
    example (the top-ranked neighbour, as the model's prompt shows it) is copied, its change
    applied to the query's state, its reward and done taken as they are. A query whose example's
    change does not fit its state is an explicit failure, as it is for the model. Retrieval,
    placeholders, parsing and the rule layers (the learnt actions that adapt the examples, the
    memory of places) are the model's own code and settings, so that the difference to the model
    is the LM alone (ablation.py)."""

    def __init__(
        self,
        config: ExperienceConfig,
        database=None,
        encoder=None,
        ef_search: int = 80,
        seed: int = 0,
        kept_names: frozenset[str] | None = None,
        affordances: Affordances | None = None,
    ):
        if not config.neighbours:
            raise ValueError("copying the top neighbour needs retrieval (experience.neighbours > 0)")
        # A copy is the same on every try: retrying it would only cost time.
        config = dataclasses.replace(config, retries=0)
        super().__init__(None, None, config, database, encoder, ef_search, seed, kept_names, affordances)

    def generate(self, prompts: Sequence[str], *args, **kwargs) -> list[str]:
        # Nothing retrieved to copy: the parser refuses the empty completion.
        return [copied_completion(prompt, self.config.reasoning) or "" for prompt in prompts]


def _picked(values: Sequence | None, rows: Sequence[int]) -> list | None:
    """The items of `values` (one per prompt, or None) for the batch rows `rows`."""
    return None if values is None else [values[row] for row in rows]


@contextmanager
def open_experience_model(
    model_dir: str | Path, run_dir: str | Path, config: PipelineConfig, copy_neighbours: bool = False
) -> Iterator[ExperienceModel]:
    """The model in `model_dir` with its buffer and encoder, ready to predict.

    With experience.backend: http the model is the one the server serves; `model_dir` is read only
    for the prompt shape the model was trained with (its settings file), when it is there. With
    `copy_neighbours`, no model: the top neighbour's change in that model's prompts (`NeighbourCopy`).
    """
    from dreamgym.buffer.embeddings import Encoder  # heavy imports, needed here only
    from dreamgym.buffer.migrations import open_migrated
    from dreamgym.experience.remote import RemoteExperienceModel  # it builds on this module
    from dreamgym.lm.model import load_model

    settings = trained_settings(model_dir, config.experience)
    kept = trained_kept_names(model_dir)
    learnt = Affordances.load(Path(model_dir) / AFFORDANCES_FILE) if settings.adapts_examples else None
    weights = None if settings.backend == "http" or copy_neighbours else load_model(model_dir)

    def build(database, encoder) -> ExperienceModel:
        shared = (settings, database, encoder, config.buffer.ef_search, config.seed, kept, learnt)
        if copy_neighbours:
            return NeighbourCopy(*shared)
        if weights is None:
            return RemoteExperienceModel(*shared)
        return ExperienceModel(*weights, *shared)

    if not settings.neighbours:
        yield build(None, None)
        return
    with open_migrated(run_dir, config.buffer) as database:
        yield build(database, Encoder(config.buffer.encoder))
