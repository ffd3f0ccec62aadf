"""The `games` section of `params.yaml`: the TextWorld cooking games the pipeline plays when
`env.name` is 'textworld' (`dreamgym/envs/textworld/games.py` makes them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic.dataclasses import dataclass

from dreamgym.sections import STRICT, described

SPLITS = ("train", "valid", "test")
TW_ROOM_CHOICES = (1, 6, 9, 12)

# Game i of a split is made with seed * GAME_SEED_STRIDE + i (envs/textworld/games.py), and tw-make
# (numpy's RandomState) takes seeds below 2**32.
GAME_SEED_STRIDE = 100_000
MAX_SEED = (2**32 - GAME_SEED_STRIDE) // GAME_SEED_STRIDE


@dataclass(config=STRICT)
class GamesConfig:
    """TextWorld cooking games (`tw-make tw-cooking`). Each game draws its settings from the lists."""

    recipe: Annotated[
        tuple[int, ...], described("Ingredients per recipe; each game draws one value.", min_length=1)
    ] = (
        1,
        2,
    )
    take: Annotated[
        tuple[int, ...],
        described(
            "Ingredients the player must find (capped at the recipe size); each game draws one value.", min_length=1
        ),
    ] = (1, 2)
    go: Annotated[
        tuple[int, ...], described("Rooms per game, from 1, 6, 9 or 12; each game draws one value.", min_length=1)
    ] = (1, 6)
    open: Annotated[bool, described("Containers and doors must be opened.")] = True
    cook: Annotated[bool, described("Some ingredients must be cooked.")] = True
    cut: Annotated[bool, described("Some ingredients must be cut.")] = True
    train_count: Annotated[int, described("Training games (--split train).", ge=1, lt=GAME_SEED_STRIDE)] = 32
    test_count: Annotated[
        int,
        described(
            "Held-out evaluation games (--split test: unseen foods and preparations).", ge=0, lt=GAME_SEED_STRIDE
        ),
    ] = 40
    task_count: Annotated[
        int,
        described(
            "More training-split games (the ones after the training games) whose tasks RL practises: no "
            "trajectory is collected from them; RL in DreamEnv starts from their initial states (one reset "
            "each, no step) and RL in the real games may play them. 0: RL practises the training games only.",
            ge=0,
            lt=GAME_SEED_STRIDE,
        ),
    ] = 80
    target_train_count: Annotated[
        int,
        described(
            "Training-split games of the target preset (games.target: headroom) whose trajectories join the "
            "offline data, beside the train_count games of the settings above: the few hard games that real "
            "interaction with the target tasks gives (with target 'same': more games of the training settings). "
            "Made after the task games, so never one RL practises. 0: none.",
            ge=0,
            lt=GAME_SEED_STRIDE,
        ),
    ] = 8
    workers: Annotated[int, described("Games compiled in parallel.", ge=1)] = 2
    target: Annotated[
        Literal["same", "headroom"],
        described(
            "The tasks RL practises and the held-out games the gate measures: 'same' settings as the "
            "training games above; 'headroom' the named preset of harder games, recipes of 2-3 with 2-3 "
            "ingredients to find in 6 or 9 rooms (dreamgym.envs.textworld.games.HEADROOM), which BC, trained "
            "mostly on the easier games (and target_train_count of these), mostly loses. With 'headroom' RL "
            "practises the preset's task games only, and the held-out games of the training settings are "
            "still played, beside."
        ),
    ] = "headroom"

    def __post_init__(self) -> None:
        total = self.train_count + self.task_count + self.target_train_count
        if total > GAME_SEED_STRIDE:
            raise ValueError(
                f"train_count + task_count + target_train_count is {total}, above the "
                f"{GAME_SEED_STRIDE} games a seed has: lower task_count or target_train_count"
            )
        for value in self.recipe:
            if not 1 <= value <= 5:
                raise ValueError(f"recipe value {value} is out of range: use 1 to 5 ingredients")
        for value in self.take:
            if not 0 <= value <= 5:
                raise ValueError(f"take value {value} is out of range: use 0 to 5 ingredients")
        for value in self.go:
            if value not in TW_ROOM_CHOICES:
                raise ValueError(
                    f"go value {value} is not supported by tw-cooking: use one of "
                    f"{', '.join(map(str, TW_ROOM_CHOICES))}"
                )
