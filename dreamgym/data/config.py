"""The sections of `params.yaml` that make and check the offline data (`dreamgym/data/`): the games,
the real environment, collection and validation."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic.dataclasses import dataclass

from dreamgym.sections import STRICT, described

SPLITS = ("train", "valid", "test")
POLICIES = ("expert", "noisy-expert", "random")
TW_ROOM_CHOICES = (1, 6, 9, 12)

# Game i of a split is made with seed * GAME_SEED_STRIDE + i (dreamgym.data.games), and tw-make
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
    train_count: Annotated[int, described("Training games (--split train).", ge=1, lt=GAME_SEED_STRIDE)] = 40
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
    workers: Annotated[int, described("Games compiled in parallel.", ge=1)] = 2
    target: Annotated[
        Literal["same", "headroom"],
        described(
            "The tasks RL practises and the held-out games the gate measures: 'same' settings as the "
            "training games above; 'headroom' the named preset of harder games, recipes of 2-3 with 2-3 "
            "ingredients to find in 6 or 9 rooms (dreamgym.data.games.HEADROOM), which BC, trained on the "
            "easier games, mostly loses. With 'headroom' RL practises the preset's task games only, and the "
            "held-out games of the training settings are still played, beside."
        ),
    ] = "headroom"

    def __post_init__(self) -> None:
        if self.train_count + self.task_count > GAME_SEED_STRIDE:
            raise ValueError(
                f"train_count + task_count is {self.train_count + self.task_count}, above the "
                f"{GAME_SEED_STRIDE} games a seed has: lower task_count"
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


@dataclass(config=STRICT)
class EnvConfig:
    """The real environment."""

    name: Annotated[
        Literal["textworld", "scienceworld"],
        described(
            "The real environment: TextWorld cooking games (the `games` section) or ScienceWorld tasks (the "
            "`scienceworld` section; params-scienceworld.yaml is its preset)."
        ),
    ] = "textworld"
    max_steps: Annotated[int, described("Steps before an episode is truncated.", ge=1, le=1000)] = 50


@dataclass(config=STRICT)
class CollectConfig:
    """Offline trajectory collection on the training games."""

    episodes_per_game: Annotated[int, described("Episodes played on each game.", ge=1)] = 5
    policy: Annotated[
        Literal["expert", "noisy-expert", "random"],
        described(
            "Behaviour policy: the game's expert, the expert with random actions "
            "at rate epsilon, or uniformly random admissible actions."
        ),
    ] = "noisy-expert"
    epsilon: Annotated[
        float, described("Probability of a random admissible action (noisy-expert).", ge=0.0, le=1.0)
    ] = 0.3
    mistake_episodes: Annotated[
        int,
        described(
            "Episodes per game, besides episodes_per_game, in which the expert makes one mistake that "
            "collect.domain names (slicing what the recipe says to dice), so that the buffer shows the "
            "experience model what such a move does; 0: none (dreamgym/data/collect.py).",
            ge=0,
        ),
    ] = 1
    domain: Annotated[
        Literal["textworld-cooking", "none"],
        described(
            "The environment's rules that name the mistakes of collect.mistake_episodes "
            "(dreamgym/domain.py); 'none' names none.",
        ),
    ] = "textworld-cooking"
    workers: Annotated[int, described("Games played in parallel processes.", ge=1)] = 2


@dataclass(config=STRICT)
class ValidationConfig:
    """Great Expectations checks on collected transitions."""

    max_bad_fraction: Annotated[
        float, described("Largest fraction of quarantined rows that still passes.", ge=0.0, le=1.0)
    ] = 0.02
    max_text_chars: Annotated[int, described("Longest allowed state/next-state/instruction text.", ge=16)] = 8000
    max_action_chars: Annotated[int, described("Longest allowed action text.", ge=4)] = 200
    reward_min: Annotated[float, described("Smallest allowed step reward.")] = -1.0
    reward_max: Annotated[float, described("Largest allowed step reward.")] = 10.0

    def __post_init__(self) -> None:
        if self.reward_min > self.reward_max:
            raise ValueError(f"reward_min ({self.reward_min}) is above reward_max ({self.reward_max}): swap them")
