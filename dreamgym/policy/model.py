"""The agent: a causal LM that reads task, recent actions and state, and picks an action.

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

Scoring shares the prompt: prompts are encoded once (left-padded, one forward pass with the KV
cache) and every candidate action continues from its prompt's cache, so a state with 20
available actions costs one prompt pass plus 20 short continuations, not 20 full passes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dreamgym.config import PolicyConfig, config_part
from dreamgym.errors import DreamgymError
from dreamgym.lm.model import ModelNotFoundError, device_and_dtype, load_pretrained, save_model
from dreamgym.policy.view import PolicyInput, policy_input

SETTINGS_FILE = "policy.json"
VALUE_HEAD_FILE = "value_head.pt"
KEPT_NAMES_FILE = "kept_names.json"


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
    `policy.avoid_repeats` cannot leave out what was tried here)."""

    instruction: str
    recent_actions: tuple[str, ...]
    state: str
    past_states: tuple[str, ...] | None = None


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

    def view(self, observation: Observation) -> PolicyInput:
        """The prompt and candidate texts of one observation, as behaviour cloning made them."""
        return policy_input(
            observation.instruction,
            observation.recent_actions,
            observation.state,
            self.config.history,
            self.kept_names,
            list_actions=self.config.mode == "generate",
            past_states=observation.past_states if self.config.avoid_repeats else None,
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

    def _encode_prompts(self, prompts: Sequence[str], reserve: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and mask; a prompt too long for max_length - `reserve` loses its
        start but keeps its first (BOS) token, as in training."""
        budget = max(8, self.config.max_length - reserve)
        rows = []
        for prompt in prompts:
            ids = self.tokenizer(prompt)["input_ids"]
            if len(ids) > budget:
                ids = ids[:1] + ids[len(ids) - budget + 1 :]
            rows.append(ids)
        width = max(len(ids) for ids in rows)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in rows], device=self.device)
        return input_ids, mask

    def score_actions(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]], with_values: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-likelihood of each candidate action given its prompt (the sum over its tokens, EOS
        included, or their mean with `action_score: mean`), flattened in order (prompt 0's
        candidates, then prompt 1's, ...); and the value of each prompt if asked. Differentiable:
        call under `torch.no_grad()` when acting."""
        if len(prompts) != len(candidates) or any(not options for options in candidates):
            raise PolicyError("every prompt needs at least one candidate action")
        eos = self.tokenizer.eos_token_id
        action_ids = [
            self.tokenizer(action_completion(action), add_special_tokens=False)["input_ids"] + [eos]
            for options in candidates
            for action in options
        ]
        width = max(len(ids) for ids in action_ids)
        input_ids, mask = self._encode_prompts(prompts, reserve=width)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            output_hidden_states=with_values,
        )
        first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # each action's first token
        owner = torch.tensor([i for i, options in enumerate(candidates) for _ in options], device=self.device)
        cache = out.past_key_values
        for layer in cache.layers:  # every candidate continues from its own prompt's cache
            layer.keys, layer.values = layer.keys[owner], layer.values[owner]
        pad = self.tokenizer.pad_token_id
        tokens = torch.tensor([ids + [pad] * (width - len(ids)) for ids in action_ids], device=self.device)
        token_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in action_ids], device=self.device)
        lengths = mask.sum(-1)[owner]
        rest = self.model(
            input_ids=tokens,
            attention_mask=torch.cat([mask[owner], token_mask], dim=1),
            position_ids=lengths[:, None] + torch.arange(width, device=self.device),
            past_key_values=cache,
            use_cache=False,
        )
        following = torch.log_softmax(rest.logits[:, :-1].float(), dim=-1)
        predicted = torch.cat([first[owner][:, None], following], dim=1)  # token t from t-1's logits
        token_logprobs = predicted.gather(-1, tokens[..., None]).squeeze(-1) * token_mask
        values = None
        if with_values:
            if self.value_head is None:
                raise PolicyError("this policy has no value head; call add_value_head() first (PPO)")
            values = self.value_head(out.hidden_states[-1][:, -1].float()).squeeze(-1)
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
