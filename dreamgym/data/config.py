"""The sections of `params.yaml` that make and check the offline data (`dreamgym/data/`): the real
environment, collection and validation. The games are TextWorld's own section
(`dreamgym/envs/textworld/config.py`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic.dataclasses import dataclass

from dreamgym.sections import STRICT, described

POLICIES = ("expert", "noisy-expert", "random")


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
