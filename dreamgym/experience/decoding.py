"""Decoding that guesses first, and the pieces generation shares with it.

The experience model nearly always names its first worked example, so a greedy completion is first
guessed (`copied_completion`) and the guess checked against the model for all its tokens in one
forward pass (`DraftDecoding.checked_drafts`); a row whose greedy choice differs is decoded on
from there, each pass checking a guess of the next tokens looked up in the prompt
(`DraftDecoding.speculated`). Both give exactly the tokens token-by-token decoding gives under the
same rules (`Rules`, constrain.py), greedy or sampled (`SeededSampling`): they are faster, not
different (measured: results log, 2026-11-28 to 2026-11-30).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList

from dreamgym.experience.format import (
    NO_CHANGE,
    SAME_AS,
    example_changes,
    example_outcomes,
    example_traces,
    format_completion,
)
from dreamgym.state import AbstractState

# Generation stops at the end of the completion's last section, whatever follows in the vocabulary.
STOP = "</done>"
RETRY_TEMPERATURE = 0.8
# Prompts checked against their drafts in one forward pass, shortest first: a pass pads every row
# to its longest (prompts run from ~150 to ~650 tokens); 4 rows padded less and ran faster than 8.
VERIFY_CHUNK = 4
# A written-out completion mostly copies runs of its prompt, so each forward pass checks a guess of
# the next LOOKAHEAD tokens: those that followed the last earlier place where the completion's last
# tokens (up to LOOKUP_NGRAM) appeared (`looked_up`). This is transformers' "prompt lookup", which
# cannot take our rules (it runs them on made-up scores); ~1.9x faster than token by token on a CPU.
LOOKAHEAD = 10
LOOKUP_NGRAM = 3
# Generation settings that change the scores decoding chooses by; a model whose generation config sets
# any of them is decoded by transformers' generate (the drafts' check and speculation know only the
# model's scores and constrain.py's rules).
_SCORE_SETTINGS = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens", "sequence_bias")
_NEUTRAL = (None, 0, 1.0, [], {})


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
    signature at every call (8% of a step on a GPU); these rules take the ids and scores alone,
    and `checked_drafts` and `speculated` call them once a token."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.FloatTensor:
        for rule in self:
            scores = rule(input_ids, scores)
        return scores


def sample_seed(seed: int, attempt: int, prompts: Sequence[str]) -> int:
    """The sampling seed of a retry: from the run's seed, the attempt and the prompts themselves,
    so that one query's retry draws the same sample in any batch and any process."""
    digest = hashlib.sha256("\n".join(prompts).encode()).digest()
    return (seed + attempt * 1_000_003 + int.from_bytes(digest[:4], "big")) % 2**31


class DraftDecoding:
    """Checked drafts and speculation, mixed into `generate.ExperienceModel`: they read its
    `model`, `tokenizer`, `config` and `seed`, and its decoding rules (`_constraints`)."""

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


def ended_at_stop(text: str, stopped_on_it: bool = False) -> str:
    """`text` ending right after its first stop string (a batch row pads on after it, and the token
    that completed it may hold more), or with the stop string given back where generation
    `stopped_on_it` and the server dropped it."""
    if STOP in text:
        return text[: text.index(STOP) + len(STOP)]
    return text + STOP if stopped_on_it else text
