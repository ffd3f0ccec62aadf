"""Behaviour cloning: the warm start (and the paper's SFT baseline), trained with TRL's SFTTrainer
on the successful real trajectories through the same trainer as the experience model.

An example is one step of a won episode: prompt = the policy prompt at that step, completion =
the action taken. Failed episodes are left out: imitating them would teach the failures.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dreamgym.config import PolicyConfig
from dreamgym.errors import DreamgymError
from dreamgym.experience.model import FROM_SCRATCH, init_model, load_pretrained, train_tokenizer
from dreamgym.experience.train import TrainResult, train_sft
from dreamgym.policy.model import Policy, action_completion, policy_prompt, save_settings


def episodes(rows: Iterable[Mapping]) -> list[list[Mapping]]:
    """Transitions grouped by trajectory, each in step order, trajectories sorted by id."""
    by_trajectory: dict[str, list[Mapping]] = defaultdict(list)
    for row in rows:
        by_trajectory[row["trajectory_id"]].append(row)
    return [sorted(steps, key=lambda row: row["step"]) for _, steps in sorted(by_trajectory.items())]


def won(episode: Sequence[Mapping]) -> bool:
    return bool(episode) and bool(episode[-1]["won"])


def bc_examples(rows: Iterable[Mapping], history: int) -> list[dict[str, str]]:
    """Prompt/completion pairs from every step of every won real episode."""
    examples = []
    for episode in episodes(row for row in rows if row["source"] == "real"):
        if not won(episode):
            continue
        actions: list[str] = []
        for row in episode:
            recent = actions[-history:] if history else []
            examples.append({"prompt": policy_prompt(row["instruction"], recent, row["state"]),
                             "completion": action_completion(row["action"])})
            actions.append(row["action"])
    return examples


def initial_policy(examples: Sequence[dict[str, str]], config: PolicyConfig, seed: int) -> Policy:
    """The untrained policy BC starts from: from scratch, a tokenizer learned from the examples
    and random weights (the same ones `train_bc` starts from with the same seed); else the named
    pretrained model."""
    if config.model != FROM_SCRATCH:
        model, tokenizer = load_pretrained(config.model)
    else:
        if not examples:
            raise DreamgymError("no successful real episodes to learn a policy tokenizer from; collect "
                                "more data (collect.policy: noisy-expert succeeds often)")
        tokenizer = train_tokenizer((text for e in examples for text in (e["prompt"], e["completion"])),
                                    config.vocab_size)
        model = init_model(tokenizer, config, seed)
    return Policy(model, tokenizer, config).eval()


def train_bc(examples: Sequence[dict[str, str]], config: PolicyConfig, output_dir: str | Path, seed: int,
             progress: bool = True, log_to_mlflow: bool = False) -> TrainResult:
    """Behaviour cloning with SFTTrainer (loss on the actions only); resumable and reused like the
    experience model's training (`train_sft`). The saved folder is a loadable policy."""
    if not examples:
        raise DreamgymError("no successful real episodes to clone; collect more data or lower the "
                            "collection's epsilon")
    result = train_sft(examples, config, Path(output_dir), seed, progress=progress, log_to_mlflow=log_to_mlflow)
    save_settings(result.model_dir, config)
    return result
