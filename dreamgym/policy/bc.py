"""Behaviour cloning: the warm start (and the paper's SFT baseline).

An example is one step of a real episode: prompt = the policy's input at that step
(`dreamgym.policy.view`, the same function acting uses), candidates = the available actions as the
policy scores them, label = the action to imitate.

Which action: where the data records the environment's expert action for the step
(`expert_action`, what the game's walkthrough does from that state), every step of every real
episode is an example labelled with it, won or lost. The noisy expert that collects the data
takes a random action 3 steps in 10; cloning what it *did* teaches those random steps too, and
leaving its failed episodes out throws away the states a policy must recover from. Labelling each
visited state with the expert's choice keeps both (DART/DAgger-style relabelling). Data without
labels (another environment, older files) falls back to the actions of the won episodes. The
mistake episodes (`collect.mistake_episodes`) are left out: they are there to show the experience
model what a mistake does, and their states, the expert's path up to the mistake, are those the
behaviour policy's episodes already show (cloning them too would only cost `make run` time).

Counterfactual tasks (`policy.domain`): a step that carries out a clause of its task (slicing the
carrot because the recipe says `slice the carrot`) is also an example under the same task with
that clause changed (`dice the carrot`), labelled with the action the changed task asks for (`dice
carrot with knife`); the domain (dreamgym/domain.py) knows which clauses can change and what they
ask for. It is also shown with another ingredient's clause of that kind changed (`slice the
pepper` -> `chop the pepper`), labelled with the same action: what the recipe asks of the pepper
does not change how the carrot is cut. Why: a policy can fit its training games without reading the
recipe (recalling each game: BC without them nearly always won its training games, yet often kept
the old verb when the recipe's was changed), and one that reads it can still take the wrong
ingredient's clause (measured: results log, 2026-11-26).

Untied embeddings (the from-scratch policy reads tokens with one matrix and scores them with
another). Counterfactual tasks show one state with `slice`, `chop` and `dice` as labels in turn; a
policy that cannot yet read which one the recipe asks for does best scoring the three alike, and
with one matrix for both jobs that also makes them read alike: their embeddings merged, and the
policy never learnt to read them, or did by chance in one run and not in the next (training is
not bit-for-bit reproducible across processes). Untied, it learns to follow the changed verbs in
every run (measured: results log, 2026-11-26).

The objective is the acting rule (`policy.mode`):
- `choice`: the policy acts by a softmax over the scores of the available actions, so BC minimises
  exactly that distribution's cross-entropy, -log π(label | s) (`choice_loss`). A token-level LM
  loss on the label's text (what TRL's SFT trains) does not: it spends its capacity on the
  predictable tail of each action ("... with knife"), and the mean token log-likelihood that
  acting reads then ranks a wrong verb on the right object close to the right one (measured:
  results log, 2026-11-24). This loop is written here because TRL has no objective over a
  set of candidate completions.
- `generate`: the policy samples free text, so BC is TRL's SFT on prompt/completion (the
  likelihood that generation samples from), through the experience model's trainer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dreamgym.data.schema import MISTAKE_POLICY, episodes
from dreamgym.domain import named_domain
from dreamgym.errors import DreamgymError
from dreamgym.lm.model import FROM_SCRATCH, deterministic_kernels, init_model, load_pretrained, train_tokenizer
from dreamgym.lm.sft import RESULT_FILE, TrainResult, claim_run_directory, train_sft, training_settings
from dreamgym.placeholders import kept_names
from dreamgym.policy.config import PolicyConfig
from dreamgym.policy.model import Policy, action_completion, save_settings
from dreamgym.policy.view import configured_input

# Log about 100 loss points per run.
LOG_POINTS = 100


def won(episode: Sequence[Mapping]) -> bool:
    return bool(episode) and bool(episode[-1]["won"])


def labelled(episode: Sequence[Mapping]) -> bool:
    """Whether every step of the episode records the expert's action."""
    return all(row.get("expert_action") for row in episode)


def policy_kept_names(rows: Iterable[Mapping], config: PolicyConfig) -> frozenset[str] | None:
    """The names that keep their text in the policy's prompts (None: placeholders off), learnt
    from the real transitions the policy is cloned from."""
    if not config.placeholders:
        return None
    return kept_names(row for row in rows if row["source"] == "real")


def bc_examples(rows: Iterable[Mapping], config: PolicyConfig, kept: frozenset[str] | None = None) -> list[dict]:
    """One example per step to imitate (see the module docstring for which steps and labels),
    followed by one for each of the step's counterfactual tasks (`policy.domain`): `prompt`,
    `completion` (the label as text), `candidates` (the available actions as scored) and `label`
    (the label's index among them). A label the policy could not choose (not available, or with
    `policy.avoid_repeats` already taken from that state in the episode) makes no example."""
    domain = named_domain(config.domain)
    examples = []
    for episode in episodes(row for row in rows if row["source"] == "real" and row.get("policy") != MISTAKE_POLICY):
        relabel = labelled(episode)
        if not relabel and not won(episode):
            continue
        actions: list[str] = []
        states: list[str] = []  # the state each of `actions` was taken from
        for row in episode:
            label = row["expert_action"] if relabel else row["action"]
            tasks = ((row["instruction"], label), *domain.task_variants(row["instruction"], label))
            for instruction, action in tasks:
                view = configured_input(config, domain, kept, instruction, actions, row["state"], states)
                if action in view.actions:
                    examples.append(
                        {
                            "prompt": view.prompt,
                            "completion": action_completion(view.rename(action)),
                            "candidates": list(view.candidates),
                            "label": view.actions.index(action),
                        }
                    )
            actions.append(row["action"])
            states.append(row["state"])
    return examples


def initial_policy(
    examples: Sequence[dict], config: PolicyConfig, seed: int, kept: frozenset[str] | None = None
) -> Policy:
    """The untrained policy BC starts from: from scratch, a tokenizer learned from the examples'
    prompts and actions and random weights (the same ones `train_bc` starts from with the same
    seed); else the named pretrained model."""
    if config.model != FROM_SCRATCH:
        model, tokenizer = load_pretrained(config.model)
    else:
        if not examples:
            raise DreamgymError(
                "no real episodes to learn a policy tokenizer from; collect more data "
                "(collect.policy: noisy-expert records the expert's action at every step)"
            )
        texts = (
            text
            for e in examples
            for text in (e["prompt"], e["completion"], *map(action_completion, e.get("candidates", ())))
        )
        tokenizer = train_tokenizer(texts, config.vocab_size)
        # Untied: with one matrix for reading and scoring, learning to score `slice`, `chop` and
        # `dice` alike (before the policy can read which one the recipe asks for) also makes them
        # read alike, and the policy may then never learn to read them (module docstring).
        model = init_model(tokenizer, config, seed, tie_embeddings=False)
    return Policy(model, tokenizer, config, kept_names=kept).eval()


def choice_loss(
    distributions: Sequence[torch.Tensor], labels: Sequence[int], weights: Sequence[float] | None = None
) -> torch.Tensor:
    """BC's loss in mode choice: the mean over a minibatch of -log π(label | s), where
    `distributions[i]` holds log π(· | s_i) over example i's candidates (shape (n_i,)) and
    `labels[i]` indexes the action to imitate; with `weights`, their weighted mean (an example
    that stands for several copies counts as many times). 0 when every label has probability 1."""
    if len(distributions) != len(labels) or not labels:
        raise ValueError(f"{len(distributions)} distributions for {len(labels)} labels")
    if weights is not None and (len(weights) != len(labels) or min(weights) <= 0):
        raise ValueError(f"{len(labels)} labels need as many positive weights, got {list(weights)}")
    losses = -torch.stack([distribution[label] for distribution, label in zip(distributions, labels)])
    if weights is None:
        return losses.mean()
    weight = torch.tensor(weights, dtype=losses.dtype, device=losses.device)
    return (losses * weight).sum() / weight.sum()


def merge_repeats(examples: Sequence[dict]) -> tuple[list[dict], list[int]]:
    """Each distinct example once (the same prompt, candidates and label), in the order first seen,
    and how many times each occurs. The noisy expert's episodes of a game share their first steps
    (each step is labelled with the expert's action, whatever the episode did), so the default
    data's 4,929 examples hold 3,655 distinct ones (results log, 2026-12-07 (23:00))."""
    counts: dict[tuple, int] = {}
    first: dict[tuple, dict] = {}
    for example in examples:
        key = (example["prompt"], tuple(example["candidates"]), example["label"])
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, example)
    return list(first.values()), list(counts.values())


def train_bc(
    examples: Sequence[dict],
    config: PolicyConfig,
    output_dir: str | Path,
    seed: int,
    kept: frozenset[str] | None = None,
    progress: bool = True,
    log_to_mlflow: bool = False,
) -> TrainResult:
    """Behaviour cloning with the objective of `config.mode` (module docstring). A finished run
    in `output_dir` is reused (`reused=True`); the saved folder `output_dir/model` is a loadable
    policy."""
    if not examples:
        raise DreamgymError(
            "no real episodes to clone: none is labelled with the expert's action and "
            "none was won; collect more data or lower the collection's epsilon"
        )
    if config.mode == "generate":
        result = train_sft(examples, config, Path(output_dir), seed, progress=progress, log_to_mlflow=log_to_mlflow)
        save_settings(result.model_dir, config, kept)
        return result
    return _train_choice(examples, config, Path(output_dir), seed, kept, progress, log_to_mlflow)


def _identity(examples: Sequence[dict], config: PolicyConfig, seed: int) -> dict:
    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps([example["prompt"], example["candidates"], example["label"]]).encode())
    return {
        "objective": "choice",
        "examples": digest.hexdigest(),
        "settings": {**training_settings(config), "seed": seed},
    }


def _schedule(step: int, total: int, warmup_ratio: float) -> float:
    """Learning-rate factor: linear warmup over `warmup_ratio` of the steps, then linear decay."""
    warmup = max(1, round(warmup_ratio * total))
    return (step + 1) / warmup if step < warmup else max(0.0, (total - step) / max(1, total - warmup))


def _token_counts(examples: Sequence[dict], policy: Policy) -> tuple[int, int]:
    """Tokens one pass over the examples reads (prompts and every candidate with its EOS), and how
    many prompts lose their start to `max_length` (`Policy.score_actions` keeps room for the
    longest candidate of the batch, so this is the least that are cut)."""
    tokenizer, tokens, truncated = policy.tokenizer, 0, 0
    for example in examples:
        prompt = len(tokenizer(example["prompt"])["input_ids"])
        actions = [
            len(tokenizer(action_completion(action), add_special_tokens=False)["input_ids"]) + 1
            for action in example["candidates"]
        ]
        tokens += prompt + sum(actions)
        truncated += prompt > max(8, policy.config.max_length - max(actions))
    return tokens, truncated


def _train_choice(
    examples: Sequence[dict],
    config: PolicyConfig,
    output_dir: Path,
    seed: int,
    kept: frozenset[str] | None,
    progress: bool,
    log_to_mlflow: bool,
) -> TrainResult:
    started = time.perf_counter()
    identity = _identity(examples, config, seed)
    recorded = claim_run_directory(output_dir, identity)
    if recorded is not None:
        raise DreamgymError(
            f"{output_dir} holds a behaviour-cloning run of other examples or settings; "
            "use another output directory or delete it"
        )
    finished = output_dir / "model" / RESULT_FILE
    if finished.is_file():
        return dataclasses.replace(
            TrainResult.from_json(finished.read_text()), model_dir=output_dir / "model", reused=True
        )

    deterministic_kernels()
    # The tokenizer learns from every copy, as `initial_policy` does for the saved untrained policy.
    policy = initial_policy(examples, config, seed, kept).train()
    weights = None  # unmerged: the plain mean, as before the setting existed
    if config.merge_repeats:
        examples, weights = merge_repeats(examples)
    tokens, truncated = _token_counts(examples, policy)
    if log_to_mlflow:
        import mlflow  # slow import
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.learning_rate)
    total = max(1, round(len(examples) * config.epochs / config.batch_size))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _schedule(step, total, config.warmup_ratio))
    rng, order, losses = random.Random(seed), [], []
    every = max(1, total // LOG_POINTS)
    running, seen = 0.0, 0
    with tqdm(total=total, desc="behaviour cloning", unit="step", disable=not progress) as bar:
        for step in range(total):
            if len(order) < config.batch_size:
                order += rng.sample(range(len(examples)), len(examples))
            chosen, order = order[: config.batch_size], order[config.batch_size :]
            batch = [examples[i] for i in chosen]
            distributions, _ = policy.log_probs([e["prompt"] for e in batch], [e["candidates"] for e in batch])
            loss = choice_loss(distributions, [e["label"] for e in batch], weights and [weights[i] for i in chosen])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            running, seen = running + loss.item(), seen + 1
            if (step + 1) % every == 0 or step + 1 == total:
                losses.append((step + 1, running / seen))
                bar.set_postfix(loss=f"{running / seen:.3f}")
                if log_to_mlflow:
                    mlflow.log_metric("train_loss", running / seen, step=step + 1)
                running, seen = 0.0, 0
            bar.update()
    policy.eval()
    model_dir = policy.save(output_dir / "model")
    seconds = time.perf_counter() - started
    result = TrainResult(
        model_dir=model_dir,
        steps=total,
        epochs=config.epochs,
        train_losses=losses,
        eval_losses=[],
        eval_loss=None,
        seconds=seconds,
        tokens_per_second=tokens * config.epochs / seconds,
        truncated=truncated,
        parameters=sum(p.numel() for p in policy.model.parameters()),
    )
    (model_dir / RESULT_FILE).write_text(result.to_json())
    return result
