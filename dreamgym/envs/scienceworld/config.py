"""The `scienceworld` section of `params.yaml`: which ScienceWorld tasks the pipeline plays when
`env.name` is 'scienceworld' (`dreamgym/envs/scienceworld/tasks.py` writes them)."""

from __future__ import annotations

from typing import Annotated

from pydantic.dataclasses import dataclass

from dreamgym.sections import STRICT, described

# Short tasks (5-10 gold steps) with many variations, all solved with the verbs of
# `observation.FIND_VERBS`: what a small policy can learn on 2 cores. The other 24 of
# ScienceWorld's 30 task types are selectable by name.
FIND_TASKS = (
    "find-animal",
    "find-living-thing",
    "find-non-living-thing",
    "find-plant",
    "lifespan-longest-lived",
    "lifespan-shortest-lived",
)


@dataclass(config=STRICT)
class ScienceWorldConfig:
    """ScienceWorld tasks (types and variations), under the 'easy' simplification."""

    tasks: Annotated[
        tuple[str, ...],
        described("Task types, by ScienceWorld's names (e.g. find-animal, boil); 30 exist.", min_length=1),
    ] = FIND_TASKS
    train_variations: Annotated[
        int,
        described("Variations per task type, from its train split, that offline data is collected on.", ge=1),
    ] = 10
    test_variations: Annotated[
        int,
        described("Held-out variations per task type, from its test split: the evaluation's games.", ge=0),
    ] = 10
    task_variations: Annotated[
        int,
        described(
            "More train-split variations per task type whose tasks RL practises (no trajectories collected).",
            ge=0,
        ),
    ] = 10
