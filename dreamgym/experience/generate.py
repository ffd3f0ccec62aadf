"""The experience model at work: predict next state, reward and done for many transitions at once.

`ExperienceModel.predict` takes a batch of (task, history, state, action) queries, retrieves each
one's worked examples from the buffer in one batched query, writes the prompts, generates all
completions batched (KV cache on, left padding; rows that finished leave the batch as it goes on),
and parses them. A greedy completion is first guessed, not written: the model nearly always
names its first worked example (`copied_completion`), so that copy is checked against the model
for all its tokens in one forward pass (`checked_drafts`), and only the rows where the model's
greedy choice differs somewhere are decoded, on from where it differs, each pass checking a guess
of several tokens looked up in the prompt (`speculated`). A completion that does not parse is
generated again by sampling (a different draw each retry; a batch's retries together, each row
drawn from its own generator seeded by its prompt, `SeededSampling`); one that still does not parse
comes back as an explicit failure with the parser's reason — never as a made-up state or a zero
reward.

`RemoteExperienceModel` (experience.backend: http) generates on an OpenAI-compatible completions
server instead (infra/SERVING.md): `vllm serve <model_dir>` on a GPU box takes a batch's prompts as
one list in one request; `transformers serve <model_dir>` (CPU) takes one prompt per request, so
each prompt goes alone, a few requests at a time (experience.backend_batching; 'auto' finds out at
the first batch). Retrieval, prompts, parsing and retries are the same code as for the local model.

Decoding over HTTP, against the local backend:
- kept: the first attempt is greedy (temperature 0); a retry samples at RETRY_TEMPERATURE with no
  top-k or top-p cut, seeded by `sample_seed` (`seed` in the request: vLLM seeds the request
  itself; transformers serve reseeds its process-wide generator, so sampled requests go one at a
  time), and also carries transformers serve's own `generation_config` field, without which it
  decodes greedily whatever the temperature (vLLM ignores the field); at most max_new_tokens; the
  stop string, each completion cut right after it (and given it back where the server drops it).
- lost: constrained decoding (experience.constrained_decoding; the server knows nothing of states
  or worked examples, so a completion the rules would have steered may fail to parse and be
  retried); the left-truncation of a prompt longer than max_length - max_new_tokens (vLLM refuses
  it with HTTP 400; transformers serve decodes it past the model's trained context); compaction
  (the server schedules the batch). With constrained decoding off locally, greedy predictions over
  HTTP are the local ones (tests/test_experience_serve.py, against transformers serve), up to the
  float rounding of other kernels and batch shapes, which can flip a near-tie.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList, StoppingCriteriaList, StopStringCriteria

from dreamgym.config import PipelineConfig
from dreamgym.domain import named_domain
from dreamgym.envs.dynamics import Prediction, Query, Step
from dreamgym.errors import DreamgymError
from dreamgym.experience.affordances import AFFORDANCES_FILE, Affordances
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.constrain import DeltaConstraint
from dreamgym.experience.examples import adapted_examples, neighbours, to_worked, traces_examples
from dreamgym.experience.format import (
    FORMAT_VERSION,
    NO_CHANGE,
    SAME_AS,
    FormatError,
    example_changes,
    example_outcomes,
    example_traces,
    format_completion,
    format_prompt,
    parse_completion,
    whole_word,
    with_real_names,
)
from dreamgym.experience.places import remembered
from dreamgym.placeholders import Placeholders, shown_names
from dreamgym.sections import config_part
from dreamgym.state import AbstractState

# Generation stops at the end of the completion's last section, whatever follows in the vocabulary.
STOP = "</done>"
RETRY_TEMPERATURE = 0.8
# A KV cache allocated once for prompt + max_new_tokens instead of the default one that grows (and
# is copied) at every step: the same tokens; on 2 CPU cores one generate of 32 long completions
# took 5.8 s instead of 15.0 s, and DreamEnv stepped 32 episodes at 4.5 instead of 3.7
# transitions/s (no difference at batch 1 or 8).
# On a GPU, transformers compiles the forward pass of a generate with a static cache, once for every
# new batch shape; ours change at every call (prompt lengths, compaction), and on an H200 (2026-11-27)
# the fine-tuned SmolLM2 predicted ~2 transitions/s while the compiler recompiled: generate is called
# with disable_compile (no effect on a CPU, which transformers never compiles for).
CACHE = "static"
# A batch decodes until its longest completion ends, and completions differ in length: in a DreamEnv
# batch of 32 the mean is ~45 tokens and the longest ~135. So every COMPACT_AFTER new tokens the
# rows still writing go on alone (their prompts and tokens so far prefilled again), with the same
# greedy tokens. 2 CPU cores, DreamEnv batch 32: a generate took 0.8-1.0 s instead of 1.1-1.6 s;
# compacting only once, after 48, saved less; every 24 or 32 tokens, nothing (the prefills eat it).
COMPACT_AFTER = 48
# Prompts checked against their drafts in one forward pass, shortest first: a pass pads every row to
# its longest, and a DreamEnv batch's prompts run from ~150 to ~650 tokens. With 4 rows instead of
# 8, 12 batches of 32 DreamEnvs x 4 random moves padded 7% fewer tokens, and their checks' forward
# passes took 17.0-17.5 s instead of 18.9-19.4 s (2 CPU cores, 2026-11-30; probably memory: the
# pass's attention weights, rows x heads x length^2, are allocated afresh each time).
VERIFY_CHUNK = 4
# A completion the model writes out after its draft failed mostly copies runs of its prompt (a worked
# example's items, the state's), so it is decoded speculatively (`speculated`): each forward pass
# over the cached tokens checks a guess of the next LOOKAHEAD tokens, those that followed the last
# earlier place where the completion's last tokens (up to LOOKUP_NGRAM) appeared (`looked_up`: the
# "prompt lookup" of transformers' assisted generation, which cannot take our rules: it runs them
# on made-up scores to cut its guesses, and they pick a token by score). The same text, in 2.2
# tokens a pass on 19 rows of DreamEnv random moves: 1.9x faster than decoding a row token by token
# (2 CPU cores, 2026-11-30; 10 or 16 tokens, 2 to 6 of them matched, all alike). One row at a time:
# 4 rows speculated one by one took 0.8x the time of their batch, 8 rows 1.0x, 16 rows 1.2x, so on a
# CPU a batch of more than SPECULATED_ROWS is decoded together. On a GPU a pass over a few rows
# costs about what a pass over one does, so only a row alone is speculated there (not measured: no
# GPU was lent when this was written).
LOOKAHEAD = 10
LOOKUP_NGRAM = 3
SPECULATED_ROWS = 4
# Generation settings that change the scores decoding chooses by; a model whose generation config sets
# any of them is decoded by transformers' generate (the drafts' check and speculation know only the
# model's scores and constrain.py's rules).
_SCORE_SETTINGS = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens", "sequence_bias")
_NEUTRAL = (None, 0, 1.0, [], {})
SETTINGS_FILE = "experience.json"  # beside the weights: the prompt shape the model was trained on
# Settings that shape a prompt or completion: a model must be used with the ones it learned.
BACKOFF_SECONDS = 0.5  # backend http: the first retry waits this long, each next one twice as long
_RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
_REFUSED_STATUS = frozenset({400, 422})  # a refusal that names the prompt: see PromptRefusedError
# One-prompt requests (a server that takes no list) in flight at once: enough to keep a batching
# server (vLLM, transformers serve --continuous-batching) busy; a sequential one (plain transformers
# serve) queues them, so more would only wait longer against experience.backend_timeout.
SINGLE_REQUESTS = 8
# transformers serve samples only when the request's `generation_config` says so (a saved model's
# generation_config.json sets no do_sample: greedy, whatever the temperature), and then with
# transformers' default top-k 50 unless told otherwise; the local retry has no top-k or top-p cut.
# vLLM ignores the field.
SAMPLING_CONFIG = json.dumps({"do_sample": True, "top_k": 0, "top_p": 1.0})


class ExperienceFormatError(DreamgymError):
    """A trained model whose prompts had another shape than the ones this code writes."""


class ExperienceBackendError(DreamgymError):
    """An experience-model server that cannot be reached or gives no usable completions."""


class SeededSampling(LogitsProcessor):
    """Sampling at `temperature` with one generator per batch row, as the last logits processor of
    a greedy `generate`: each row's token is drawn from its own generator and the rest of its
    scores set to -inf, so that decoding's argmax takes it. A row's draws then depend on its seed
    alone, not on the rows beside it: the retries of a batch are sampled together, and each is the
    draw it would be alone (transformers' own sampling draws every row from one generator)."""

    def __init__(self, generators: Sequence[torch.Generator], temperature: float):
        self.generators, self.temperature = generators, temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(scores / self.temperature, dim=-1)
        drawn = torch.cat(
            [torch.multinomial(probs[row : row + 1], 1, generator=g) for row, g in enumerate(self.generators)]
        )
        return torch.full_like(scores, -math.inf).scatter_(1, drawn, 0.0)


class Rules(LogitsProcessorList):
    """The decoding rules of a batch, applied in order. transformers' list inspects each rule's
    signature at every call (8% of the model's part of a step at batch 1 on a GPU under cProfile,
    2026-11-29); these rules take the ids and scores alone, and `checked_drafts` and `speculated`
    call them once a token."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.FloatTensor:
        for rule in self:
            scores = rule(input_ids, scores)
        return scores


def sample_seed(seed: int, attempt: int, prompts: Sequence[str]) -> int:
    """The sampling seed of a retry: from the run's seed, the attempt and the prompts themselves,
    so that one query's retry draws the same sample in any batch and any process."""
    digest = hashlib.sha256("\n".join(prompts).encode()).digest()
    return (seed + attempt * 1_000_003 + int.from_bytes(digest[:4], "big")) % 2**31


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


class ExperienceModel:
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
        if tokenizer is not None:
            self.tokenizer.padding_side = "left"  # batched generation continues every prompt at its end
            self.tokenizer.truncation_side = "left"  # the state and action sit at the prompt's end

    def retrieved(self, queries: Sequence[Query]) -> list[list[dict]]:
        """Each query's neighbour transitions from the buffer, most similar first."""
        return neighbours(
            self.database,
            self.encoder,
            [
                {"instruction": q.instruction, "state": q.state, "action": q.action, "trajectory_id": q.trajectory_id}
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

    def _drafts_checkable(self) -> bool:
        """Whether the prompts have drafts (`copied_completion`) and decoding chooses by the
        model's scores under constrain.py's rules alone, which is what `checked_drafts` checks."""
        return self.config.copy_examples and bool(self.config.neighbours) and self._rules_alone()

    def _rules_alone(self) -> bool:
        """Whether decoding chooses by the model's scores under constrain.py's rules (and, sampled,
        `SeededSampling`) alone, as `checked_drafts` and `speculated` do: no setting of the model's
        generation config changes them."""
        settings = self.model.generation_config
        return all(getattr(settings, name, None) in _NEUTRAL for name in _SCORE_SETTINGS)

    @torch.inference_mode()
    def checked_drafts(
        self,
        prompts: Sequence[str],
        states: Sequence[AbstractState] | None = None,
        changes: Sequence[Sequence[str]] | None = None,
        traces: Sequence[Sequence[str | None]] | None = None,
    ) -> list[str | list[int] | None]:
        """Each prompt's `copied_completion` where greedy decoding (with the same rules as
        `generate`) writes exactly it; else the tokens that greedy decoding writes first (the
        draft's, up to where it differs, and the one decoding writes there instead); None for a
        prompt without a draft. Prompt and draft go through the model together, and the draft holds
        where each of its tokens is the argmax of the scores before it: what decoding would have
        chosen, found in one pass instead of one per token."""
        drafts = [copied_completion(prompt, self.config.reasoning) for prompt in prompts]
        rows = [index for index, draft in enumerate(drafts) if draft is not None]
        if not rows:
            return [None] * len(prompts)
        prompt_ids = self._prompt_ids([prompts[i] for i in rows])
        draft_ids = self.tokenizer([drafts[i] for i in rows], add_special_tokens=False)["input_ids"]
        longest = max(map(len, draft_ids))
        # logits[r, j]: the scores for draft token j of row r, after the prompt and tokens 0..j-1.
        logits = None
        by_length = sorted(range(len(rows)), key=lambda r: len(prompt_ids[r]) + len(draft_ids[r]))
        for start in range(0, len(by_length), VERIFY_CHUNK):
            chunk = by_length[start : start + VERIFY_CHUNK]
            scored = self._draft_scores([prompt_ids[r] for r in chunk], [draft_ids[r] for r in chunk])
            for r, scores in zip(chunk, scored):
                if logits is None:
                    logits = torch.empty(len(rows), longest, scores.shape[-1])
                logits[r, : len(scores)] = scores
        pad = self.tokenizer.pad_token_id
        tokens = torch.tensor([ids + [pad] * (longest - len(ids)) for ids in draft_ids])  # pad: "" for the rules
        lengths = torch.tensor([len(ids) for ids in draft_ids])
        rules = self._constraints(rows, 0, states, changes, traces, sample=False)
        differs_at = torch.full((len(rows),), longest)  # where each row's draft first differs
        chosen = torch.zeros(len(rows), dtype=torch.long)  # the token decoding writes there
        for position in range(longest):
            best = rules(tokens[:, :position], logits[:, position].clone()).argmax(dim=-1)
            first = (position < lengths) & (position < differs_at) & (best != tokens[:, position])
            differs_at[first], chosen[first] = position, best[first]
        checked: list[str | list[int] | None] = [None] * len(prompts)
        for r, index in enumerate(rows):
            at = int(differs_at[r])
            checked[index] = drafts[index] if at >= lengths[r] else [*draft_ids[r][:at], int(chosen[r])]
        return checked

    @torch.inference_mode()
    def speculated(
        self,
        prompt: str,
        known: Sequence[int] = (),
        states: Sequence[AbstractState] | None = None,
        changes: Sequence[Sequence[str]] | None = None,
        traces: Sequence[Sequence[str | None]] | None = None,
        sample: bool = False,
        attempt: int = 0,
    ) -> str:
        """The completion of one prompt whose first tokens are `known`, greedy or sampled, with the
        same rules as `generate` (`states`, `changes`, `traces`: this prompt's, as lists of one),
        each forward pass checking a guess of the tokens that follow (`looked_up`): the tokens of
        the guess that decoding chooses are taken, with the one it chooses after them. The rules
        see each token once, in order, as in decoding token by token; and a sampled token is drawn
        from the prompt's own generator (`SeededSampling`) once per position, in order, so that the
        draws are those of `_decode`."""
        [prompt_ids] = self._prompt_ids([prompt])
        tokens = prompt_ids + list(known)[: self.config.max_new_tokens]
        rules = self._constraints([0], len(prompt_ids), states, changes, traces, sample)
        if sample:
            generator = torch.Generator(self.model.device).manual_seed(sample_seed(self.seed, attempt, [prompt]))
            rules.append(SeededSampling([generator], RETRY_TEMPERATURE))
        cache = DynamicCache(config=self.model.config)
        fed = 0  # the tokens before `fed` are in the cache
        end = self.tokenizer.eos_token_id
        while True:
            written = len(tokens) - len(prompt_ids)
            text = self.tokenizer.decode(tokens[len(prompt_ids) :], skip_special_tokens=True)
            if STOP in text or written >= self.config.max_new_tokens or (written and tokens[-1] == end):
                return ended_at_stop(text)
            guess = looked_up(tokens, min(LOOKAHEAD, self.config.max_new_tokens - written - 1))
            logits = (
                self.model(
                    input_ids=torch.tensor([tokens[fed:] + guess], device=self.model.device),
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=len(guess) + 1,
                )
                .logits[0]
                .float()
            )  # on the model's device, as `_decode`'s scores and generators are
            for position in range(len(guess) + 1):
                scores = rules(torch.tensor([tokens]), logits[position : position + 1].clone())
                tokens.append(int(scores.argmax()))
                if position == len(guess) or tokens[-1] != guess[position] or tokens[-1] == end:
                    break
            # The cache holds the guess; keep only the tokens taken before the last one, fed next.
            cache.crop(-(cache.get_seq_length() - (len(tokens) - 1)))
            fed = len(tokens) - 1

    def _prompt_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        """Each prompt's token ids, unpadded, cut from the left as `encode` cuts them."""
        budget = self.config.max_length - self.config.max_new_tokens
        return self.tokenizer(list(prompts), truncation=True, max_length=budget)["input_ids"]

    def _draft_scores(self, prompt_ids: list[list[int]], draft_ids: list[list[int]]) -> list[torch.Tensor]:
        """Each row's scores for its draft tokens, (draft length, vocabulary): one forward pass
        over the prompts and drafts, left-padded, positions counted from each row's first token."""
        joined = [p + d for p, d in zip(prompt_ids, draft_ids)]
        width, longest = max(map(len, joined)), max(map(len, draft_ids))
        ids = torch.full((len(joined), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, tokens in enumerate(joined):
            ids[row, width - len(tokens) :] = torch.tensor(tokens)
            mask[row, width - len(tokens) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        kept = (
            self.model(
                input_ids=ids.to(self.model.device),
                attention_mask=mask.to(self.model.device),
                position_ids=positions.to(self.model.device),
                logits_to_keep=longest + 1,
            )
            .logits.float()
            .cpu()
        )
        # Row r's draft ends at the last column; its token j is scored at column width - len(d) - 1 + j.
        return [kept[row, longest - len(draft) : longest] for row, draft in enumerate(draft_ids)]

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

    def remembered(self, queries: Sequence[Query]) -> list[AbstractState | None]:
        """Each query's next state where it moves back into a place its episode has been
        (experience.remember_places, places.py), else None."""
        if not self.config.remember_places or self.affordances is None:
            return [None] * len(queries)
        return [remembered(query, self.affordances) for query in queries]

    @property
    def history(self) -> int:
        """Earlier steps of the episode a query carries (DreamEnv's `Dynamics`)."""
        return self.config.history

    def predict(self, queries: Sequence[Query]) -> list[Prediction]:
        """The predicted step of each query, in its real names (`Prediction.text` is what the
        model wrote, in the prompt's). A prompt that several queries share is written once: a GRPO
        group's rollouts start from one state and often take the same first moves, and what the
        model writes depends on nothing but the prompt (greedy, or sampled with a seed of it)."""
        places = self.remembered(queries)
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
                    if places[index] is not None:
                        completion = dataclasses.replace(completion, next_state=places[index])
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
    placeholders and parsing are the model's own code. Nor does it remember the places of an
    episode (places.py): the baseline is the neighbour's change alone."""

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
        config = dataclasses.replace(config, retries=0, remember_places=False)
        super().__init__(None, None, config, database, encoder, ef_search, seed, kept_names, affordances)

    def generate(self, prompts: Sequence[str], *args, **kwargs) -> list[str]:
        # Nothing retrieved to copy: the parser refuses the empty completion.
        return [copied_completion(prompt, self.config.reasoning) or "" for prompt in prompts]


def _picked(values: Sequence | None, rows: Sequence[int]) -> list | None:
    """The items of `values` (one per prompt, or None) for the batch rows `rows`."""
    return None if values is None else [values[row] for row in rows]


def looked_up(tokens: Sequence[int], count: int, ngram: int = LOOKUP_NGRAM) -> list[int]:
    """Up to `count` tokens that followed the last earlier place where the last `ngram` tokens of
    `tokens` appeared (or, where they appear nowhere earlier, fewer of them): the guess that a copy
    goes on as it went there. Empty where not even the last token appeared before."""
    if count <= 0:
        return []
    for size in range(min(ngram, len(tokens) - 1), 0, -1):
        tail = list(tokens[-size:])
        for start in range(len(tokens) - size - 1, -1, -1):
            if tokens[start] == tail[0] and list(tokens[start : start + size]) == tail:
                return list(tokens[start + size : start + size + count])
    return []


def copied_completion(prompt: str, reasoning: bool) -> str | None:
    """The completion that copies the prompt's first worked example as the model learned to write
    it (format.referenced_delta): its change and trace named (`same as example 1`; `no change` as
    it is, being shorter), its reward and done; None for a prompt without examples."""
    outcomes = example_outcomes(prompt)
    if not outcomes:
        return None
    reward, done = outcomes[0]
    reference = SAME_AS.format(1)
    change = NO_CHANGE if example_changes(prompt)[0] == NO_CHANGE else reference
    if not reasoning:
        return format_completion(None, change, reward, done)
    trace = reference if example_traces(prompt)[0] is not None else "as in example 1"
    return format_completion(trace, change, reward, done)


class PromptRefusedError(ExperienceBackendError):
    """A server's refusal (HTTP 400/422) that names the prompt: the prompts themselves (e.g. one too
    long for the context), or a list of them where the server takes one prompt per request."""


class RemoteExperienceModel(ExperienceModel):
    """The experience model served by an OpenAI-compatible completions endpoint (e.g. vLLM serving
    the trained model directory); no local weights. A batch is one request with the list of its
    prompts, or one request per prompt where the server takes no list (experience.backend_batching);
    each request is retried on its own (connection errors, timeouts, HTTP 429/5xx).

    The server tokenizes and does not truncate: a prompt longer than its context is refused
    (HTTP 400) by vLLM, where the local model would left-truncate it to
    `max_length - max_new_tokens`. The module docstring says which decoding rules hold over HTTP.
    """

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
        if not (config.backend_url and config.backend_model):
            raise ValueError("a remote experience model needs experience.backend_url and experience.backend_model")
        super().__init__(None, None, config, database, encoder, ef_search, seed, kept_names, affordances)
        self.url = f"{config.backend_url.rstrip('/')}/completions"
        # Whether the server takes a list of prompts: set, or (auto: None) learnt from the first
        # batch and kept for the model's life, so that no later batch pays for a refused request.
        self.takes_lists: bool | None = {"list": True, "single": False}.get(config.backend_batching)

    def generate(
        self,
        prompts: Sequence[str],
        sample: bool = False,
        attempt: int = 0,
        states: Sequence[AbstractState] | None = None,
        changes: Sequence[Sequence[str]] | None = None,
        traces: Sequence[Sequence[str | None]] | None = None,
    ) -> list[str]:
        """Completions of `prompts`: greedy, or sampled (seeded) for a retry. Nothing is constrained
        here (`states`, `changes` and `traces` are unused): the server decodes freely."""
        if not prompts:
            return []
        if sample and len(prompts) > 1:  # each retry seeded by its own prompt: one request each
            return [self.generate([prompt], sample, attempt)[0] for prompt in prompts]
        if self.takes_lists is not False:
            try:
                texts = self._texts(self._post(self._body(list(prompts), sample, attempt)), len(prompts))
            except PromptRefusedError as refusal:
                if self.takes_lists is None:  # auto: is it the list that is refused, or the prompts?
                    self.takes_lists = not self._refuses_lists(prompts[0])
                    if not self.takes_lists:
                        return self._one_by_one(prompts, sample, attempt)
                if self.config.backend_batching == "list":
                    raise ExperienceBackendError(
                        f"{refusal}; if the server takes one prompt per request (transformers serve), "
                        "set experience.backend_batching: single or auto"
                    ) from None
                raise refusal
            self.takes_lists = True
            return texts
        return self._one_by_one(prompts, sample, attempt)

    def _body(self, prompt: str | list[str], sample: bool, attempt: int) -> dict:
        """The request for `prompt` (a batch's list, or one prompt)."""
        body = {
            "model": self.config.backend_model,
            "prompt": prompt,
            "max_tokens": self.config.max_new_tokens,
            "temperature": RETRY_TEMPERATURE if sample else 0,
            "stop": [STOP],
        }
        if sample:
            body["seed"] = sample_seed(self.seed, attempt, [prompt] if isinstance(prompt, str) else prompt)
            body["generation_config"] = SAMPLING_CONFIG
        return body

    def _refuses_lists(self, prompt: str) -> bool:
        """Whether the server refuses a list of prompts but takes the prompt alone; asked with
        one-token completions of `prompt`, as a list of one and then alone. A refusal of the
        prompt alone is raised: the prompts themselves are what the server refuses."""
        probe = {"model": self.config.backend_model, "max_tokens": 1, "temperature": 0}
        try:
            self._post(probe | {"prompt": [prompt]})
        except PromptRefusedError:
            self._post(probe | {"prompt": prompt})
            return True
        return False  # a list is taken: the batch's refusal was about its prompts

    def _one_by_one(self, prompts: Sequence[str], sample: bool, attempt: int) -> list[str]:
        """Completions of `prompts`, one request each, in prompt order; at most SINGLE_REQUESTS at
        a time, and a sampled one only after the one before has its answer (transformers serve
        seeds its process-wide generator per request: two at a time would draw from each other's)."""
        bodies = [self._body(prompt, sample, attempt) for prompt in prompts]
        workers = 1 if sample else min(SINGLE_REQUESTS, len(bodies))
        if workers == 1:
            return [self._texts(self._post(body), 1)[0] for body in bodies]
        # `map` answers in prompt order and, at the first error, cancels the requests not sent yet.
        with ThreadPoolExecutor(workers, thread_name_prefix="experience-backend") as pool:
            return [self._texts(response, 1)[0] for response in pool.map(self._post, bodies)]

    def _post(self, body: dict) -> httpx.Response:
        """The server's 200 answer, after retries with backoff of what may pass (connection
        errors, timeouts, HTTP 429/5xx); `ExperienceBackendError` when there is none, and
        `PromptRefusedError` when the server refused the request naming its prompt."""
        retries = self.config.backend_retries
        for retry in range(retries + 1):
            if retry:
                time.sleep(BACKOFF_SECONDS * 2 ** (retry - 1))
            try:
                response = httpx.post(self.url, json=body, timeout=self.config.backend_timeout)
            except httpx.TimeoutException:
                problem = (
                    f"no answer within {self.config.backend_timeout:g}s; raise "
                    "experience.backend_timeout or check the server's load"
                )
                continue
            except httpx.HTTPError as error:
                problem = f"request failed ({error}); check experience.backend_url and that the server is up"
                continue
            if response.status_code == 200:
                return response
            problem = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code not in _RETRIED_STATUS:
                refused = response.status_code in _REFUSED_STATUS and "prompt" in response.text.lower()
                raise (PromptRefusedError if refused else ExperienceBackendError)(
                    f"experience backend {self.url}: {problem} (check experience.backend_model "
                    f"{self.config.backend_model!r} and experience.backend_url)"
                )
        tries = f"{retries + 1} attempt{'s' if retries else ''}"
        raise ExperienceBackendError(f"experience backend {self.url}: {problem} ({tries}; experience.backend_retries)")

    def _texts(self, response: httpx.Response, count: int) -> list[str]:
        """The completion texts in prompt order, each ending right after the stop string when the
        server stopped on it: vLLM and OpenAI drop the string (the parser wants the closing tag, so
        it is given back); transformers serve keeps it, with whatever the token that completed it
        held after it (cut, as the local model cuts it)."""
        try:
            choices = sorted(response.json()["choices"], key=lambda choice: choice["index"])
            texts = [
                (
                    choice["text"],
                    choice.get("finish_reason"),
                    # vLLM says which stop ended it (None: EOS); other servers only "stop"
                    choice.get("stop_reason", STOP),
                )
                for choice in choices
            ]
            if not all(isinstance(text, str) for text, _, _ in texts):
                raise TypeError("a choice's text is not a string")
        except (ValueError, KeyError, TypeError):
            raise ExperienceBackendError(
                f"experience backend {self.url}: not a completions answer: {response.text[:200]}"
            ) from None
        if [choice["index"] for choice in choices] != list(range(count)):
            raise ExperienceBackendError(
                f"experience backend {self.url}: {len(choices)} choices for {count} prompts "
                f"(indices {[choice['index'] for choice in choices][:10]}); the server must answer "
                "one completion per prompt (no `n` or `best_of` override)"
            )
        return [ended_at_stop(text, finish == "stop" and reason == STOP) for text, finish, reason in texts]


def ended_at_stop(text: str, stopped_on_it: bool = False) -> str:
    """`text` ending right after its first stop string (a batch row pads on after it, and the token
    that completed it may hold more), or with the stop string given back where generation
    `stopped_on_it` and the server dropped it."""
    if STOP in text:
        return text[: text.index(STOP) + len(STOP)]
    return text + STOP if stopped_on_it else text


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
