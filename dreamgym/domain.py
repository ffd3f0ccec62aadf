"""The seam between generic code (the experience model, behaviour cloning) and one environment's rules.

Retrieval ranks a query's candidate neighbours (rerank.py) by keys that hold in any text
environment — the same action, a change that fits the state, the same items acted on, the share of
state items — and by three that need to know the environment: how an action stands to its task,
what kind of thing it acts on, and which statuses of the things a change names decide whether it
happens. A `Domain` answers those three, and names the objects a task asks for (a dreamt
container or room holds them: see `dreamgym.placeholders`). The policy's behaviour cloning asks it
one more thing: how a task could have asked for another action at the same step (counterfactual
tasks, dreamgym/policy/bc.py); the curriculum may ask it for other tasks a seed's start could pose
(its variations); collection, for the mistakes a learner could make at a step
(dreamgym/data/collect.py). `NoRules` answers none (those keys then tie and the generic ones
decide; BC clones the steps as they are; no mistakes are played): where a new environment starts.
TextWorld cooking's answers are `envs/textworld/cooking.py`; `experience.domain` names the one a
model is built and used with, `policy.domain` the one BC uses, `collect.domain` the one collection
asks.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol

from dreamgym.state import AbstractState


class Domain(Protocol):
    """An environment's rules for ranking worked examples and varying tasks. Implementations are
    frozen dataclasses (hashable: ranked rows are cached per domain)."""

    def task_relation(self, instruction: str | None, state: AbstractState, action: str) -> Hashable | None:
        """How `action` in `state` stands to the task `instruction` (None: unknown task); two steps
        in the same relation tend to score alike."""
        ...

    def kinds(self, state: AbstractState, action: str) -> frozenset[str]:
        """What kinds of thing the items `action` names are, from their real names (placeholders
        hide them from the model, not from retrieval)."""
        ...

    def statuses(self, state: AbstractState, change: str) -> Mapping[str, str]:
        """The status in `state` (e.g. open or closed) of each thing that the available actions of
        `change` (a state delta) name: a change carries over only where these are alike."""
        ...

    def task_objects(self, instruction: str) -> tuple[str, ...]:
        """The objects `instruction` asks for, by their real names, in its order."""
        ...

    def task_variants(self, instruction: str, action: str) -> tuple[tuple[str, str], ...]:
        """Other tasks the step that takes `action` for `instruction` could be shown under, each
        with the action it asks for: the one clause `action` carries out changed (another action),
        or a like clause on another object changed (the same action). Behaviour cloning shows the
        policy the same state under each (dreamgym/policy/bc.py)."""
        ...

    def instruction_variants(self, instruction: str) -> tuple[str, ...]:
        """Other tasks the same initial state could pose that can still be won: `instruction`
        with what it asks changed, the objects kept (the curriculum's variations when
        `curriculum.variations` is 'domain', dreamgym/curriculum.py)."""
        ...

    def mistakes(self, instruction: str, action: str) -> tuple[str, ...]:
        """The actions a learner could take instead of `action` that `instruction` does not ask for
        (slicing what the recipe says to dice): collection plays them once in a while
        (`collect.mistake_episodes`), so that the buffer shows the experience model what they do."""
        ...


@dataclass(frozen=True)
class NoRules:
    """A domain that knows nothing of its environment: only the generic keys rank."""

    def task_relation(self, instruction: str | None, state: AbstractState, action: str) -> Hashable | None:
        return None

    def kinds(self, state: AbstractState, action: str) -> frozenset[str]:
        return frozenset()

    def statuses(self, state: AbstractState, change: str) -> Mapping[str, str]:
        return {}

    def task_objects(self, instruction: str) -> tuple[str, ...]:
        return ()

    def task_variants(self, instruction: str, action: str) -> tuple[tuple[str, str], ...]:
        return ()

    def instruction_variants(self, instruction: str) -> tuple[str, ...]:
        return ()

    def mistakes(self, instruction: str, action: str) -> tuple[str, ...]:
        return ()


NO_RULES = NoRules()


def named_domain(name: str) -> Domain:
    """The domain `experience.domain`, `policy.domain` or `collect.domain` names: 'textworld-cooking'
    or 'none' (`NoRules`)."""
    if name == "none":
        return NO_RULES
    if name == "textworld-cooking":
        from dreamgym.envs.textworld.cooking import TextWorldCooking  # the one place that names an environment's rules

        return TextWorldCooking()
    raise ValueError(
        f"{name!r} names no domain: use 'textworld-cooking' or 'none' "
        "(experience.domain, policy.domain, collect.domain)"
    )
