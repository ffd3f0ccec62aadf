"""Curriculum variations as real games one step harder than their seed (`curriculum.variations:
games`).

The curriculum asks for variations of the seed tasks the policy is least sure of. This writer
answers with a game tw-cooking makes from the seed's own spec (its split and seed, read back from
the game's name) with one setting raised: one more ingredient in the recipe, one more of them to
find, or the next size of map (1, 6, 9, 12 rooms). The variation is the new game's initial state,
read by one reset and no step, so it is valid by construction (a real start, real actions) and
solvable (tw-cooking makes a game with its walkthrough); and it asks for more than the seed did,
which the offline data, the seeds and the backbone's own variations never reach.

A variation is made in the seed's split: a training game's variation never becomes a held-out
game (the test split has other foods and its own file names). Games already made are reused, so a
resumed run offers the same variations (those in its pool come back once and are rejected as
duplicates).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Sequence
from pathlib import Path

from dreamgym.curriculum import WriteVariations
from dreamgym.data.games import GameSpec, generate_games, spec_of
from dreamgym.envs.base import Task
from dreamgym.envs.textworld_env import tasks_at_start

logger = logging.getLogger(__name__)

MAX_RECIPE = 5  # tw-cooking's largest recipe
ROOMS = (1, 6, 9, 12)  # tw-cooking's map sizes (--go)


def harder_specs(spec: GameSpec) -> list[GameSpec]:
    """The specs one step harder than `spec`: a larger recipe, more of it to find (never more than
    the recipe holds), the next map size. Empty at tw-cooking's largest game."""
    steps = []
    if spec.recipe < MAX_RECIPE:
        steps.append(dataclasses.replace(spec, recipe=spec.recipe + 1))
    if spec.take < spec.recipe:
        steps.append(dataclasses.replace(spec, take=spec.take + 1))
    larger = [rooms for rooms in ROOMS if rooms > spec.go]
    if larger:
        steps.append(dataclasses.replace(spec, go=larger[0]))
    return steps


def harder_game_writer(out_dir: str | Path, seed: int = 0, workers: int = 1) -> WriteVariations:
    """`write_variations` for `Curriculum`: for each seed offered (in turn, `count` in all) one of
    its one-step-harder games not offered before, made into `out_dir`, as a Task with the seed's
    id (the curriculum names the variation), the new game's file, initial state and max score. A
    seed whose name is not a game's, or whose harder games were all offered, gets none."""
    offered: set[str] = set()

    def write(seeds: Sequence[Task], count: int) -> list[Task]:
        rng = random.Random(f"{seed}:harder:{len(offered)}:{','.join(task.task_id for task in seeds)}")
        chosen: list[tuple[Task, GameSpec]] = []
        for task in (seeds[i % len(seeds)] for i in range(count)) if seeds else ():
            spec = spec_of(task.task_id)
            if spec is None:
                logger.warning("no harder game for %s: its id is not a game's name", task.task_id)
                continue
            fresh = [step for step in harder_specs(spec) if step.name not in offered]
            if fresh:
                choice = rng.choice(fresh)
                offered.add(choice.name)
                chosen.append((task, choice))
        paths, _ = generate_games([spec for _, spec in chosen], out_dir, workers=workers, progress=False)
        return [
            dataclasses.replace(start, task_id=origin.task_id)
            for (origin, _), start in zip(chosen, tasks_at_start(paths))
        ]

    return write
