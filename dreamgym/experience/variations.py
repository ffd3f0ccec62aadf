"""Task variations written by the experience model's backbone: the curriculum's new tasks.

A second SFT objective, trained with the transitions on the same model: from a seed task (its
instruction and initial state) write a variant task, another instruction and initial state with
the same kinds of actions but other objects, goals or layout. The targets are real: other tasks'
real initial states (another recipe, other rooms), and the seed itself with every carried object
renamed (the same layout with new objects, `dreamgym/renaming.py`). The prompt and completion:

    <seed_task>...</seed_task>
    <seed_state>
    location: ...
    </seed_state>
    <variant>
  completion:
    <task>...</task>
    <state>
    location: ...
    </state>

`write_variations` samples variants for seed tasks; what comes back is checked by the
curriculum (`curriculum.check_variation`) before any is used, so a completion that is not a task
comes back as a Task whose state says so, and is rejected there with the reason.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from dreamgym.buffer.db import Database
from dreamgym.buffer.embeddings import Encoder
from dreamgym.config import PipelineConfig
from dreamgym.curriculum import Curriculum, WriteVariations, domain_variation_writer, variation_id
from dreamgym.data.schema import score_before
from dreamgym.domain import named_domain
from dreamgym.envs.base import Task
from dreamgym.errors import DreamgymError
from dreamgym.experience.affordances import Affordances, learnt_from_rows
from dreamgym.experience.annotate import make_annotator
from dreamgym.experience.examples import Example, build_examples
from dreamgym.experience.generate import CACHE
from dreamgym.placeholders import kept_names
from dreamgym.renaming import (
    Renamer,
    invented_names,
    name_vocabulary,
    names_in,
    object_names,
    renamable_names,
)

VARIANT_STOP = "</state>"
SAMPLING_TEMPERATURE = 1.0
_VARIANT = re.compile(r"\s*<task>(.*?)</task>\s*<state>\n(.*?)\n</state>\s*", re.DOTALL)
_TASK = re.compile(r"<task>(.*?)</task>", re.DOTALL)


def variation_prompt(instruction: str, state: str) -> str:
    return f"<seed_task>{instruction}</seed_task>\n<seed_state>\n{state}\n</seed_state>\n<variant>\n"


def variation_completion(instruction: str, state: str) -> str:
    return f"<task>{instruction}</task>\n<state>\n{state}\n{VARIANT_STOP}"


def parse_variation(text: str) -> tuple[str, str] | None:
    """(instruction, state text) of a completion, or None when it is not shaped as one."""
    match = _VARIANT.fullmatch(text)
    return (match[1].strip(), match[2]) if match else None


def seed_rows(rows: Sequence[Mapping]) -> list[Mapping]:
    """One first step per task: the real initial state every variation starts from."""
    firsts: dict[str, Mapping] = {}
    for row in sorted(rows, key=lambda row: (row["task_id"], row["trajectory_id"], row["step"])):
        if row["step"] == 0:
            firsts.setdefault(row["task_id"], row)
    return list(firsts.values())


def variation_examples(rows: Sequence[Mapping], per_task: int) -> list[Example]:
    """`per_task` examples per task: half other tasks' initial states, half the task renamed."""
    seeds = seed_rows(rows)
    if per_task == 0 or len(seeds) < 2:
        return []
    renamable = renamable_names(rows)
    vocabulary, known = name_vocabulary(renamable), object_names(rows)
    examples = []
    for seed in seeds:
        rng = random.Random(f"variation:{seed['task_id']}")
        others = [row for row in seeds if row["task_id"] != seed["task_id"]]
        targets = rng.sample(others, min(len(others), (per_task + 1) // 2))
        present = names_in([seed], renamable)
        for _ in range(per_task - len(targets) if present else 0):
            renamer = Renamer(invented_names(present, rng, vocabulary, avoid=known))
            targets.append(renamer.row(seed))
        prompt = variation_prompt(seed["instruction"], seed["state"])
        examples += [
            Example(
                prompt=prompt,
                completion=variation_completion(target["instruction"], target["state"]),
                trajectory_id=seed["trajectory_id"],
                task_id=seed["task_id"],
                step=0,
                content_hash=seed["content_hash"],
                objective="variation",
            )
            for target in targets
        ]
    return examples


@dataclass(frozen=True)
class TrainingExamples:
    """The experience model's supervised examples and what they were made with, which the model is
    saved with: the names kept as they are (None: no placeholders) and the learnt actions (None:
    `experience.learnt_actions` off)."""

    examples: list[Example]
    kept: frozenset[str] | None
    affordances: Affordances | None


def training_examples(
    database: Database | None, rows: Sequence[Mapping], config: PipelineConfig, progress: bool = False
) -> TrainingExamples:
    """One example per transition of `rows` (its worked examples retrieved from `database`), then the
    variations objective's: what the pipeline's experience stage trains on."""
    experience = config.experience
    encoder = Encoder(config.buffer.encoder) if experience.neighbours else None
    kept = kept_names(rows) if experience.placeholders else None
    domain = named_domain(experience.domain)
    affordances = learnt_from_rows(rows, kept, domain) if experience.adapts_examples else None
    examples = build_examples(
        database,
        encoder,
        rows,
        experience,
        config.buffer.ef_search,
        annotate=make_annotator(experience),  # state-diff, or an OpenAI-compatible endpoint
        progress=progress,
        kept=kept,
        affordances=affordances,
    )
    examples += variation_examples(rows, experience.variations_per_task)
    return TrainingExamples(examples, kept, affordances)


def seed_tasks(rows: Sequence[Mapping]) -> list[Task]:
    """The tasks of `rows` as DreamEnv tasks: instruction, real initial state and max score."""
    return [
        Task(
            task_id=row["task_id"],
            instruction=row["instruction"],
            env=row["env"],
            initial_state=row["state"],
            max_score=int(row["max_score"]),
            start_score=score_before(row),
        )
        for row in seed_rows(rows)
    ]


def variant_task(seed: Task, instruction: str, state: str) -> Task:
    return Task(
        task_id=variation_id(seed, instruction, state),
        instruction=instruction,
        env=seed.env,
        initial_state=state,
        max_score=seed.max_score,
        start_score=seed.start_score,
    )


@torch.inference_mode()
def write_variations(
    model, tokenizer, seeds: Sequence[Task], count: int, seed: int = 0, max_new_tokens: int = 512
) -> list[Task]:
    """`count` sampled variants of `seeds` (taken in turn), in one batched generation.

    A completion that is not shaped as a task comes back with what it has (its instruction, or an
    empty one) and a state that says how it ends, for the curriculum's check to reject with the
    reason.
    """
    if count <= 0 or not seeds:
        return []
    chosen = [seeds[i % len(seeds)] for i in range(count)]
    prompts = [variation_prompt(task.instruction, task.initial_state or "") for task in chosen]
    tokenizer.padding_side = "left"
    inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    torch.manual_seed(seed)
    output = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=SAMPLING_TEMPERATURE,
        top_p=None,
        top_k=None,
        use_cache=True,
        cache_implementation=CACHE,
        disable_compile=True,  # generate.CACHE says why
        stop_strings=[VARIANT_STOP],
        tokenizer=tokenizer,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    texts = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    variants = []
    for task, text in zip(chosen, texts):
        text = text[: text.index(VARIANT_STOP) + len(VARIANT_STOP)] if VARIANT_STOP in text else text
        parsed = parse_variation(text)
        if parsed is None:  # keep what there is: the check names the part that is missing
            instruction = _TASK.search(text)
            parsed = (instruction[1].strip() if instruction else "", f"unfinished variant: {text[-80:]!r}")
        variants.append(variant_task(task, *parsed))
    return variants


def variation_writer(
    model, tokenizer, seed: int = 0, max_new_tokens: int = 512
) -> Callable[[Sequence[Task], int], list[Task]]:
    """`write_variations` for `Curriculum`: bound to a model, with a new sampling seed each call
    (the same sequence of seeds in every run with the same `seed`)."""
    calls = itertools.count()
    return lambda seeds, count: write_variations(
        model, tokenizer, seeds, count, seed=seed + next(calls), max_new_tokens=max_new_tokens
    )


def dream_curriculum(
    seeds: Sequence[Task], experience, config: PipelineConfig, game_writer: WriteVariations | None = None
) -> Curriculum:
    """The curriculum of RL in DreamEnv on `seeds`, its variations written as `curriculum.variations`
    says: as real games one step harder than their seed (`games`: `game_writer`, which the
    environment provides, e.g. `envs/textworld/harder_games.harder_game_writer`), by the
    environment's rules (`domain`) or by `experience`'s backbone (`model`; none when the model is
    served over HTTP or `experience.variations_per_task` is 0)."""
    writer = None
    if config.curriculum.variations == "games":
        if game_writer is None:
            raise DreamgymError(
                "curriculum.variations is 'games' but no game maker was given: the environment makes the "
                "harder games (TextWorld: dreamgym.envs.textworld.harder_games); set "
                "curriculum.variations to 'domain' or 'model' for an environment without one"
            )
        writer = game_writer
    elif config.curriculum.variations == "domain":
        writer = domain_variation_writer(experience.domain, config.seed)
    elif experience.model is not None and config.experience.variations_per_task:
        writer = variation_writer(experience.model, experience.tokenizer, config.seed)
    return Curriculum(seeds, config.curriculum, config.seed, write_variations=writer)
