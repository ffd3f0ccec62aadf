"""The agent: a causal LM that reads recent actions, state and task, and picks an action.

The prompt and the texts of the candidate actions are made in one place, `dreamgym.policy.view`
(with placeholders on, game-specific objects are renamed `obj1`, `other1`, ... there). An action
is scored by the log-likelihood of its completion " <action><eos>" (the mean over its tokens by
default, see `policy.action_score`); behaviour cloning (`dreamgym.policy.bc`) trains the softmax
over those scores, exactly the distribution acting samples from.

Acting modes (`policy.mode`):
- `choice` (default): every available action is scored by its log-likelihood and the action is
  drawn from the softmax over those scores (greedy: the best). π(a|s) is that softmax, so the RL
  losses get exact log-probabilities, exact entropies and exact KL to the reference policy, and
  every action is valid by construction.
- `generate`: free text (for large instruction models). π(a|s) is the text's sequence
  likelihood; an unavailable action is passed to the environment, which ignores it as the game does.

Scoring shares the prompt: each prompt and all of its candidates are packed into one row, and an
attention mask lets every candidate see the prompt and its own earlier tokens only, at the
positions it would have right after the prompt. A state with 30 available actions costs one row
of prompt + 30 short actions, not 30 full passes; and, unlike continuing each candidate from a copy
of its prompt's KV cache (the way this was done before), nothing is copied per candidate, which
made BC steps and acting faster (measured: results log, 2026-11-26). Rows of like length share a
forward pass (`ROWS_PER_PASS`), and no logits are made for prompt tokens: faster again (measured:
results log, 2026-11-27).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dreamgym.domain import named_domain
from dreamgym.errors import DreamgymError
from dreamgym.lm.model import ModelNotFoundError, device_and_dtype, load_pretrained, save_model
from dreamgym.policy.config import PolicyConfig
from dreamgym.policy.view import PolicyInput, configured_input
from dreamgym.sections import config_part

SETTINGS_FILE = "policy.json"
VALUE_HEAD_FILE = "value_head.pt"
KEPT_NAMES_FILE = "kept_names.json"
# Rows (prompt + candidates) per forward pass in `score_actions`, shortest first. A pass pads its
# rows to the longest, and its attention costs the square of that: in one pass, a third of BC's
# tokens were padding. On 2 CPU cores passes of 4 rows were fastest, 2 no faster (measured: results
# log, 2026-11-27). A GPU, wider, may want more: not measured.
ROWS_PER_PASS = 4
# Token ids kept per policy, by text: BC reads every example's prompt and ~30 candidates once an
# epoch, and tokenizing them again took ~28 ms of a ~0.3 s BC step on 2 CPU cores; acting and RL
# meet the same actions ("go north", "examine counter") at every step. Cleared when full.
TOKEN_CACHE_SIZE = 1 << 16


class PolicyError(DreamgymError):
    """A policy that cannot be loaded or used as asked."""


def action_completion(action: str) -> str:
    """The completion that stands for `action` in training and scoring (EOS is added by the
    trainer and by `score_actions`)."""
    return f" {action}"


@dataclass(frozen=True)
class Observation:
    """What the policy sees at one decision: the task, the episode's actions so far, the abstract
    state; and the state each of those actions was taken from (None: not known, so
    `policy.avoid_repeats` cannot leave out what was tried here); and the actions denied here
    (RL's rollouts: those another rollout of the group lost by from this state)."""

    instruction: str
    recent_actions: tuple[str, ...]
    state: str
    past_states: tuple[str, ...] | None = None
    denied: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Decision:
    """One action the policy took: enough to recompute its probability in a loss later."""

    prompt: str
    candidates: tuple[str, ...]  # the texts scored: choice: the available actions; generate: the one text generated
    chosen: int
    logprob: float  # log π(chosen) under the policy that acted
    value: float | None = None  # the value head's estimate (PPO)
    actions: tuple[str, ...] | None = None  # the real actions behind `candidates` (None: the same texts)

    @property
    def action(self) -> str:
        """The action to play: the real text of the chosen candidate."""
        return (self.actions or self.candidates)[self.chosen]


def _segment_log_softmax(scores: torch.Tensor, sizes: Sequence[int], temperature: float) -> list[torch.Tensor]:
    return [torch.log_softmax(part / temperature, dim=0) for part in torch.split(scores, list(sizes))]


class Policy(nn.Module):
    """A causal LM policy (and, for PPO, a value head on the prompt's last hidden state)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: PolicyConfig,
        value_head: nn.Linear | None = None,
        kept_names: frozenset[str] | None = None,
    ):
        super().__init__()
        if config.placeholders and kept_names is None:
            raise PolicyError(
                "policy.placeholders needs the names that keep their text: pass kept_names "
                "(dreamgym.policy.bc.policy_kept_names of the training data)"
            )
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.value_head = value_head
        self.kept_names = kept_names if config.placeholders else None
        self._token_cache: dict[tuple[str, bool], list[int]] = {}
        self.domain = named_domain(config.domain)

    def view(self, observation: Observation) -> PolicyInput:
        """The prompt and candidate texts of one observation, as behaviour cloning made them."""
        return configured_input(
            self.config,
            self.domain,
            self.kept_names,
            observation.instruction,
            observation.recent_actions,
            observation.state,
            observation.past_states,
            observation.denied,
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def add_value_head(self, seed: int = 0) -> None:
        """A zero-initialised value head (the first value estimates are 0, not noise)."""
        if self.value_head is None:
            torch.manual_seed(seed)
            head = nn.Linear(self.model.config.hidden_size, 1)
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            self.value_head = head.to(self.device)

    # --- scoring ------------------------------------------------------------------------------

    def _token_ids(self, texts: Sequence[str], special_tokens: bool) -> list[list[int]]:
        """The token ids of each text (`TOKEN_CACHE_SIZE`); those not known yet are tokenized in
        one call. Shared lists: not to be changed by the caller."""
        cache = self._token_cache
        missing = list(dict.fromkeys(text for text in texts if (text, special_tokens) not in cache))
        if missing:
            if len(cache) + len(missing) > TOKEN_CACHE_SIZE:
                cache.clear()
            encoded = self.tokenizer(missing, add_special_tokens=special_tokens)["input_ids"]
            cache.update(((text, special_tokens), ids) for text, ids in zip(missing, encoded))
        return [cache[text, special_tokens] for text in texts]

    def _prompt_ids(self, prompts: Sequence[str], reserve: int) -> list[list[int]]:
        """Each prompt's token ids, cut to fit: one too long for max_length - `reserve` loses its
        start but keeps its first (BOS) token, as in training."""
        budget = max(8, self.config.max_length - reserve)
        return [
            ids[:1] + ids[len(ids) - budget + 1 :] if len(ids) > budget else ids
            for ids in self._token_ids(prompts, special_tokens=True)
        ]

    def _encode_prompts(self, prompts: Sequence[str], reserve: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids (`_prompt_ids`) and mask."""
        rows = self._prompt_ids(prompts, reserve)
        width = max(len(ids) for ids in rows)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in rows], device=self.device)
        return input_ids, mask

    def _packed_inputs(
        self, prompt_ids: Sequence[list[int]], action_ids: Sequence[Sequence[int]], owner: Sequence[int]
    ):
        """One row per prompt: its tokens, then each of its candidates' tokens, right-padded. A
        candidate token attends to its prompt and to the earlier tokens of its own candidate only,
        and takes the positions it would have right after the prompt (so it is scored exactly as in
        its own sequence prompt + action). Returns ids, positions, the additive 4D mask, each
        prompt's length, and each candidate's first index in its row."""
        rows = [list(ids) for ids in prompt_ids]
        segments = [[0] * len(ids) for ids in rows]
        positions = [list(range(len(ids))) for ids in rows]
        starts = []
        prompt_lengths = [len(ids) for ids in rows]
        for number, (ids, row) in enumerate(zip(action_ids, owner), 1):
            starts.append(len(rows[row]))
            rows[row] += ids
            segments[row] += [number] * len(ids)
            positions[row] += range(prompt_lengths[row], prompt_lengths[row] + len(ids))
        total = max(len(ids) for ids in rows)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (total - len(ids)) for ids in rows], device=self.device)
        position_ids = torch.tensor([p + [0] * (total - len(p)) for p in positions], device=self.device)
        segment = torch.tensor([s + [-1] * (total - len(s)) for s in segments], device=self.device)
        causal = torch.ones(total, total, dtype=torch.bool, device=self.device).tril()
        allowed = causal & ((segment[:, :, None] == segment[:, None, :]) | (segment[:, None, :] == 0))
        # Additive (eager attention adds it; SDPA takes it too), and finfo.min rather than -inf: a
        # padding token sees itself, so no row is masked out entirely.
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill(~allowed, torch.finfo(dtype).min)
        return input_ids, position_ids, mask[:, None], prompt_lengths, starts

    def score_actions(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]], with_values: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-likelihood of each candidate action given its prompt (the sum over its tokens, EOS
        included, or their mean with `action_score: mean`), flattened in order (prompt 0's
        candidates, then prompt 1's, ...); and the value of each prompt if asked. Differentiable:
        call under `torch.no_grad()` when acting.

        Rows (a prompt and its candidates) run from ~150 to ~600 tokens, and a pass pads every row
        to its longest: so rows of like length go through the model together, `ROWS_PER_PASS` at a
        time (see there)."""
        if len(prompts) != len(candidates) or any(not options for options in candidates):
            raise PolicyError("every prompt needs at least one candidate action")
        if with_values and self.value_head is None:
            raise PolicyError("this policy has no value head; call add_value_head() first (PPO)")
        eos = self.tokenizer.eos_token_id
        completions = self._token_ids(
            [action_completion(action) for options in candidates for action in options], special_tokens=False
        )
        ends = list(itertools.accumulate(map(len, candidates), initial=0))
        action_ids = [[[*ids, eos] for ids in completions[start:end]] for start, end in itertools.pairwise(ends)]
        # Room for the longest candidate of the whole call, so that a prompt is cut the same
        # whichever pass it goes in.
        reserve = max(len(ids) for options in action_ids for ids in options)
        prompt_ids = self._prompt_ids(prompts, reserve)
        length = [len(ids) + sum(map(len, options)) for ids, options in zip(prompt_ids, action_ids)]
        by_length = sorted(range(len(prompts)), key=length.__getitem__)
        passes = [by_length[start : start + ROWS_PER_PASS] for start in range(0, len(by_length), ROWS_PER_PASS)]
        scored = [
            self._score_pass([prompt_ids[i] for i in rows], [action_ids[i] for i in rows], with_values)
            for rows in passes
        ]
        # Back to the caller's order: prompt by prompt, each prompt's candidates in order.
        scored_order = [i for rows in passes for i in rows]
        rank = {prompt: n for n, prompt in enumerate(scored_order)}
        first = list(itertools.accumulate((len(action_ids[i]) for i in scored_order), initial=0))
        order = [first[rank[i]] + k for i in range(len(prompts)) for k in range(len(action_ids[i]))]
        scores = torch.cat([pass_scores for pass_scores, _ in scored])[torch.tensor(order, device=self.device)]
        values = None
        if with_values:
            back = torch.tensor([rank[i] for i in range(len(prompts))], device=self.device)
            values = torch.cat([pass_values for _, pass_values in scored])[back]
        return scores, values

    def _score_pass(
        self, prompt_ids: Sequence[list[int]], action_ids: Sequence[Sequence[list[int]]], with_values: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`score_actions` for the rows of one forward pass, in their order."""
        flat = [ids for options in action_ids for ids in options]
        owner = [row for row, options in enumerate(action_ids) for _ in options]
        input_ids, position_ids, mask, prompt_lengths, starts = self._packed_inputs(prompt_ids, flat, owner)
        # A candidate's first token is predicted at its prompt's last token, token k at token k - 1:
        # no score is read before the shortest prompt's last token, so no logits are made there.
        skipped = min(prompt_lengths) - 1
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=False,
            output_hidden_states=with_values,
            logits_to_keep=input_ids.shape[1] - skipped,
        )
        width = max(len(ids) for ids in flat)
        last = input_ids.shape[1] - 1
        sources = torch.tensor(
            [
                [prompt_lengths[row] - 1 - skipped] + [min(start + k, last) - skipped for k in range(width - 1)]
                for row, start in zip(owner, starts)
            ],
            device=self.device,
        )
        rows = torch.tensor(owner, device=self.device)[:, None]
        predicted = torch.log_softmax(out.logits[rows, sources].float(), dim=-1)
        pad = self.tokenizer.pad_token_id
        tokens = torch.tensor([ids + [pad] * (width - len(ids)) for ids in flat], device=self.device)
        token_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in flat], device=self.device)
        token_logprobs = predicted.gather(-1, tokens[..., None]).squeeze(-1) * token_mask
        values = None
        if with_values:
            ends = torch.tensor(prompt_lengths, device=self.device) - 1
            values = self.value_head(out.hidden_states[-1][torch.arange(len(prompt_ids)), ends].float()).squeeze(-1)
        scores = token_logprobs.sum(-1)
        if self.config.action_score == "mean" and self.config.mode == "choice":
            scores = scores / token_mask.sum(-1)
        return scores, values

    def log_probs(
        self,
        prompts: Sequence[str],
        candidates: Sequence[Sequence[str]],
        temperature: float = 1.0,
        with_values: bool = False,
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """log π(· | prompt) over each prompt's candidates (choice mode: the softmax of the action
        scores; generate mode: the sequence likelihood of the single candidate)."""
        scores, values = self.score_actions(prompts, candidates, with_values)
        if self.config.mode == "generate":
            return list(torch.split(scores, [len(options) for options in candidates])), values
        return _segment_log_softmax(scores, [len(options) for options in candidates], temperature), values

    # --- acting -------------------------------------------------------------------------------

    @torch.no_grad()
    def act(
        self,
        observations: Sequence[Observation],
        greedy: bool = False,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
        with_values: bool = False,
    ) -> list[Decision]:
        """One decision per observation, all in one batched forward pass."""
        if not observations:
            return []
        views = [self.view(observation) for observation in observations]
        prompts = [view.prompt for view in views]
        if self.config.mode == "generate":
            candidates = [(text,) for text in self._generate(prompts, greedy, generator, temperature)]
            actions = [(view.restore(text),) for view, (text,) in zip(views, candidates)]
        else:
            candidates = [view.candidates for view in views]
            actions = [view.actions for view in views]
        distributions, values = self.log_probs(prompts, candidates, temperature, with_values)
        decisions = []
        for i, (prompt, options, logp) in enumerate(zip(prompts, candidates, distributions)):
            if len(options) == 1:
                chosen = 0
            elif greedy:
                chosen = int(torch.argmax(logp))
            else:
                chosen = int(torch.multinomial(logp.exp().cpu(), 1, generator=generator))
            decisions.append(
                Decision(
                    prompt,
                    tuple(options),
                    chosen,
                    float(logp[chosen]),
                    float(values[i]) if values is not None else None,
                    actions=None if actions[i] == options else tuple(actions[i]),
                )
            )
        return decisions

    def _generate(
        self, prompts: Sequence[str], greedy: bool, generator: torch.Generator | None, temperature: float
    ) -> list[str]:
        """Free-text actions: the first line of each completion, stripped."""
        input_ids, mask = self._encode_prompts(prompts, reserve=self.config.max_new_tokens)
        if not greedy and generator is not None:  # generate() samples from the global RNG
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            top_k=None,
            top_p=None,
            max_new_tokens=self.config.max_new_tokens,
        )
        texts = self.tokenizer.batch_decode(out[:, input_ids.shape[1] :], skip_special_tokens=True)
        return [text.strip().split("\n")[0].strip() or "look" for text in texts]

    # --- files --------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Model, tokenizer, settings and value head in one folder (written beside it, then renamed)."""
        path = save_model(self.model, self.tokenizer, path)
        save_settings(path, self.config, self.kept_names)
        if self.value_head is not None:
            torch.save(self.value_head.state_dict(), path / VALUE_HEAD_FILE)
        return path


def save_settings(path: str | Path, config: PolicyConfig, kept_names: frozenset[str] | None) -> None:
    """The prompt settings a saved policy was trained with (its prompt must not change later),
    and with placeholders on, the names that keep their text."""
    (Path(path) / SETTINGS_FILE).write_text(json.dumps(config_part(config, "prompt", "generation", "model")))
    if config.placeholders:
        (Path(path) / KEPT_NAMES_FILE).write_text(json.dumps(sorted(kept_names or ())))


def load_policy(path: str | Path, config: PolicyConfig | None = None, train: bool = False) -> Policy:
    """A saved policy folder; its own prompt settings (policy.json) override `config`'s, because a
    policy only works with the prompt it was trained on. `train`: float32 on the training device."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{path} holds no saved policy (no config.json); train one first "
            "(`dreamgym run`) or give an MLflow URI such as models:/dreamgym-policy@champion"
        )
    model, tokenizer = load_pretrained(path)
    device, dtype = device_and_dtype()
    model = model.to(device, dtype=torch.float32 if train else dtype)
    values = json.loads((path / SETTINGS_FILE).read_text()) if (path / SETTINGS_FILE).is_file() else {}
    values.setdefault("placeholders", False)  # saved before placeholders existed: real names
    values.setdefault("avoid_repeats", False)  # saved before it existed: trained on every candidate
    values.setdefault("domain", "none")  # saved before the domain named the task's objects in the prompt
    values.setdefault("task_last", False)  # saved before the prompt gave the task last
    settings = dataclasses.replace(config or PolicyConfig(), **values)
    kept = None
    if settings.placeholders:
        if not (path / KEPT_NAMES_FILE).is_file():
            raise PolicyError(
                f"{path} is a policy with placeholders but has no {KEPT_NAMES_FILE}; "
                "save it again with Policy.save or train it again (`dreamgym run`)"
            )
        kept = frozenset(json.loads((path / KEPT_NAMES_FILE).read_text()))
    head = None
    if (path / VALUE_HEAD_FILE).is_file():
        head = nn.Linear(model.config.hidden_size, 1)
        head.load_state_dict(torch.load(path / VALUE_HEAD_FILE, map_location="cpu"))
        head = head.to(device)
    policy = Policy(model, tokenizer, settings, head, kept)
    return policy.train(train) if train else policy.eval()
