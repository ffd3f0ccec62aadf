"""The reward-entropy curriculum: which tasks the policy practises in each synthetic RL epoch.

GRPO learns nothing from a group of rollouts that all succeed or all fail: every advantage is
zero. So the curriculum keeps, per task, the outcomes of its last `window` rollouts and scores
the task by how uncertain they are:

- `entropy` (default): the binary entropy, in bits, of the task's success rate (1 at 50%);
- `variance`: the population variance of the episode returns (the paper's task value).

A task that was always solved or always failed scores 0; a task never tried scores the most
(1, or with `variance` the largest score of any tried task) so that it is tried first.

Each epoch `draw` returns `tasks_per_epoch` tasks. A share `variation_fraction` (the paper's cap
λ on synthetic tasks per iteration) are new *variations* of the top-scoring `top_fraction` of the
seed tasks, written by the experience model's backbone (the paper), by the environment's rules
(`domain_variation_writer`: the seed's start with another task) or as real games one step harder
than the seed (TextWorld's `envs/textworld/harder_games.py`), and checked by `check_variation`
(parseable state, available actions, no duplicate, no new action types); rejected ones are
logged with the reason and counted, accepted ones join the pool for good. The other slots go to
pool tasks sampled without replacement with probability proportional to their score; where too
few score above 0, tasks scoring 0 fill the epoch (`_by_score`), never a repeat of one task. With
the curriculum off (the ablation) the seed tasks are sampled uniformly and no variations are written.

A draw depends only on (seed, epoch, the recorded statistics) and what `write_variations`
returns, and `state_dict` is JSON, so a killed RL run resumes with the same pool and draws.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import logging
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from dreamgym.domain import Domain
from dreamgym.envs.base import Task
from dreamgym.rl.config import CurriculumConfig
from dreamgym.state import StateParseError, parse_state

logger = logging.getLogger("dreamgym.curriculum")

STATE_VERSION = 1

WriteVariations = Callable[[Sequence[Task], int], Iterable[Task]]


# ---------------------------------------------------------------- scores (pure functions)


def binary_entropy(p: float) -> float:
    """Entropy in bits of a success with probability `p`: 0 when the outcome is certain, 1 at 0.5."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a success rate must lie in [0, 1], got {p}")
    if p in (0.0, 1.0):
        return 0.0
    return -(p * math.log2(p) + (1.0 - p) * math.log2(1.0 - p))


def reward_variance(returns: Sequence[float]) -> float:
    """Population variance of episode returns: how much a group's advantages can differ."""
    if not returns:
        raise ValueError("the variance of no returns is undefined: record at least one rollout")
    mean = math.fsum(returns) / len(returns)
    return math.fsum((value - mean) ** 2 for value in returns) / len(returns)


def task_score(returns: Sequence[float], successes: Sequence[bool], selection: str) -> float:
    """How much a task's recent rollouts disagree: `entropy` of the success rate (0 when all
    succeeded or all failed), or `variance` of the returns (0 when all returned the same).

    The returns are those GRPO learns from (`rl.reward`): with outcome rewards their variance is 0
    exactly when the successes agree; with the score, rollouts that all failed but scored
    differently still teach, and score above 0.
    """
    if len(returns) != len(successes):
        raise ValueError(f"{len(returns)} returns but {len(successes)} successes: give one of each per rollout")
    if not returns:
        raise ValueError("a task without rollouts has no score (the curriculum tries it first)")
    if selection == "entropy":
        return binary_entropy(sum(map(bool, successes)) / len(successes))
    if selection == "variance":
        return reward_variance(returns)
    raise ValueError(f"unknown selection {selection!r}: use 'entropy' or 'variance'")


# ---------------------------------------------------------------- variations (pure functions)


def action_verb(action: str) -> str:
    """The action type of an available action: its first word ('take knife from table' -> 'take')."""
    return action.split(" ", 1)[0]


def state_verbs(states: Iterable[str | None]) -> set[str]:
    """The action types available in any of `states` (texts that do not parse are skipped)."""
    verbs: set[str] = set()
    for text in states:
        if not text:
            continue
        try:
            verbs.update(action_verb(action) for action in parse_state(text).actions)
        except StateParseError:
            continue
    return verbs


def variation_id(seed: Task, instruction: str, initial_state: str) -> str:
    """A variation's id: its seed's id and a short hash of what it asks, stable across runs."""
    digest = hashlib.sha256(f"{instruction}\n{initial_state}".encode()).hexdigest()[:10]
    return f"{seed.task_id}~{digest}"


def check_variation(candidate: Task, seed: Task, known: set[tuple[str, str]], known_verbs: set[str]) -> str | None:
    """Why `candidate` (a variation of `seed`) cannot be used, or None when it can.

    `known` holds the (instruction, initial_state) of every task already in the pool; a
    variation must not add action types (`known_verbs`), since neither the experience model nor
    the policy has seen their effects.
    """
    where = f"variation of {seed.task_id}"
    if not candidate.instruction or not candidate.instruction.strip():
        return f"{where}: the instruction is empty"
    if not candidate.initial_state:
        return f"{where}: the initial_state is missing"
    try:
        state = parse_state(candidate.initial_state)
    except StateParseError as error:
        return f"{where}: the initial_state does not parse: {error}"
    if not state.actions:
        return f"{where}: the initial_state has no available actions"
    if (candidate.instruction, candidate.initial_state) in known | {(seed.instruction, seed.initial_state)}:
        return f"{where}: duplicates a known task (same instruction and initial state)"
    unknown = sorted({action_verb(action) for action in state.actions} - known_verbs)
    if unknown:
        return (
            f"{where}: changes the action types: unknown verbs {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(sorted(known_verbs)) or 'none'})"
        )
    return None


def _asks(task: Task) -> tuple[str, str]:
    """What a task asks, from where: two tasks alike in this are duplicates."""
    return task.instruction, task.initial_state or ""


def domain_variation_writer(domain: Domain, seed: int = 0) -> WriteVariations:
    """`write_variations` from an environment's rules: each seed's initial state under each of the
    other tasks it could pose (`Domain.instruction_variants`), offered one at a time as the
    curriculum takes them, none twice. The order depends only on `seed` and the seeds offered, so a
    resumed run takes the same ones (those already in its pool come back once, and are rejected as
    duplicates)."""
    offered: set[tuple[str, str]] = set()

    def write(seeds: Sequence[Task], count: int) -> Iterator[Task]:
        candidates = [
            dataclasses.replace(task, instruction=instruction)
            for task in seeds
            for instruction in domain.instruction_variants(task.instruction)
        ]
        random.Random(f"{seed}:variations:{','.join(task.task_id for task in seeds)}").shuffle(candidates)
        for task in candidates:
            if _asks(task) not in offered:
                offered.add(_asks(task))
                yield task

    return write


# ---------------------------------------------------------------- sampling


def weighted_sample(rng: random.Random, items: Sequence[Any], weights: Sequence[float], k: int) -> list[Any]:
    """`k` items drawn with probability proportional to weight; without replacement while
    `items` suffice, with replacement when fewer than `k`."""
    if k <= 0 or not items:
        return []
    if k > len(items):
        return rng.choices(list(items), weights=list(weights), k=k)
    items, weights, chosen = list(items), list(weights), []
    for _ in range(k):
        cumulative = list(itertools.accumulate(weights))
        index = min(bisect.bisect_right(cumulative, rng.random() * cumulative[-1]), len(items) - 1)
        chosen.append(items.pop(index))
        weights.pop(index)
    return chosen


def _by_score(rng: random.Random, task_ids: Sequence[str], scores: dict[str, float], count: int) -> list[str]:
    """`count` tasks: those scoring above 0 drawn in proportion to their score, without replacement;
    where they are too few, the rest of the slots go to tasks scoring 0, drawn uniformly; only a
    pool smaller than `count` repeats a task. Repeating the few uncertain tasks instead (as this
    did before) spent whole epochs on one or two games: the policy learnt those by heart and won no
    more of its other games (measured: results log, 2026-12-02)."""
    uncertain = [task_id for task_id in task_ids if scores[task_id] > 0]
    chosen = weighted_sample(rng, uncertain, [scores[task_id] for task_id in uncertain], min(count, len(uncertain)))
    settled = [task_id for task_id in task_ids if scores[task_id] <= 0]
    chosen += rng.sample(settled, min(count - len(chosen), len(settled)))
    if len(chosen) < count:  # a pool smaller than an epoch
        weights = [scores[task_id] if scores[task_id] > 0 else 1.0 for task_id in task_ids]
        chosen += weighted_sample(rng, list(task_ids), weights, count - len(chosen))
    return chosen


# ---------------------------------------------------------------- the curriculum


class Curriculum:
    """Per-task reward statistics, the task pool (seeds and accepted variations) and the draw.

    `write_variations(top_seeds, count)` returns candidate tasks, of which the first `count` that
    pass `check_variation` are kept; each one's `task_id` names the seed it varies (the seed's own
    id, or `<seed id>~<anything>`), e.g. `dataclasses.replace(seed, instruction=...,
    initial_state=...)`. Accepted ones get a `variation_id` and the seed's env; a variation that
    is a real game (`envs/textworld/harder_games.py`) keeps its game file and max score, any
    other gets the seed's max score.
    `known_verbs` defaults to the action types of the seeds' initial states.
    """

    def __init__(
        self,
        seeds: Sequence[Task],
        config: CurriculumConfig,
        seed: int = 0,
        write_variations: WriteVariations | None = None,
        known_verbs: Iterable[str] | None = None,
    ) -> None:
        if not seeds:
            raise ValueError("the curriculum needs at least one seed task")
        ids = [task.task_id for task in seeds]
        repeated = sorted({task_id for task_id in ids if ids.count(task_id) > 1})
        if repeated:
            raise ValueError(f"seed task ids must be unique; repeated: {', '.join(repeated)}")
        self.seeds = list(seeds)
        self.config = config
        self.seed = seed
        self.write_variations = write_variations
        self.known_verbs = (
            set(known_verbs) if known_verbs is not None else state_verbs(task.initial_state for task in seeds)
        )
        if (
            config.enabled
            and write_variations is not None
            and self._variations_requested() > 0
            and not self.known_verbs
        ):
            raise ValueError(
                "no action types to check variations against: the seed tasks carry no "
                "parseable initial_state; pass known_verbs"
            )
        self.pool: dict[str, Task] = {task.task_id: task for task in seeds}
        self._stats: dict[str, deque[tuple[float, bool]]] = {
            task_id: deque(maxlen=config.window) for task_id in self.pool
        }
        self.accepted = 0
        self.rejected = 0
        self.last_scores: list[float] = []

    # ------------------------------------------------------------ statistics

    def record(self, task_id: str, returns: Sequence[float], successes: Sequence[bool]) -> None:
        """Add one group of rollouts of a task; only the last `window` rollouts count."""
        if task_id not in self._stats:
            raise ValueError(
                f"unknown task id {task_id!r}: record only tasks the curriculum drew ({len(self.pool)} in its pool)"
            )
        if len(returns) != len(successes):
            raise ValueError(
                f"task {task_id}: {len(returns)} returns but {len(successes)} successes; give one of each per rollout"
            )
        for value, success in zip(returns, successes):
            if not math.isfinite(value):
                raise ValueError(f"task {task_id}: return {value} is not a finite number")
            self._stats[task_id].append((float(value), bool(success)))

    def _tried_scores(self) -> dict[str, float]:
        return {
            task_id: task_score([r for r, _ in stats], [s for _, s in stats], self.config.selection)
            for task_id, stats in self._stats.items()
            if stats
        }

    def _scores(self) -> dict[str, float]:
        tried = self._tried_scores()
        unseen = max(tried.values(), default=0.0) if self.config.selection == "variance" else 1.0
        unseen = unseen if unseen > 0 else 1.0
        return {task_id: tried.get(task_id, unseen) for task_id in self.pool}

    def score(self, task_id: str) -> float:
        """The task's score; a task never tried scores the most, so it is tried first."""
        if task_id not in self.pool:
            raise ValueError(f"unknown task id {task_id!r}")
        return self._scores()[task_id]

    # ------------------------------------------------------------ drawing

    def _variations_requested(self) -> int:
        return round(self.config.variation_fraction * self.config.tasks_per_epoch)

    def draw(self, epoch: int) -> list[Task]:
        """This epoch's tasks: new variations of top seeds, then pool tasks by score, shuffled."""
        rng = random.Random(f"{self.seed}:{epoch}")
        count = self.config.tasks_per_epoch
        if not self.config.enabled:
            drawn = rng.sample(self.seeds, count) if count <= len(self.seeds) else rng.choices(self.seeds, k=count)
            scores = self._scores()
            self.last_scores = [scores[task.task_id] for task in drawn]
            return drawn
        scores = self._scores()
        new = self._new_variations(rng, scores)
        scores = self._scores()
        new_ids = {task.task_id for task in new}
        rest = [task_id for task_id in self.pool if task_id not in new_ids]
        drawn = new + [self.pool[task_id] for task_id in _by_score(rng, rest, scores, count - len(new))]
        rng.shuffle(drawn)
        self.last_scores = [scores[task.task_id] for task in drawn]
        return drawn

    def _top_seeds(self, rng: random.Random, scores: dict[str, float]) -> list[Task]:
        """The top `top_fraction` of seeds by score (at least one); ties broken at random."""
        keys = {task.task_id: (-scores[task.task_id], rng.random()) for task in self.seeds}
        ranked = sorted(self.seeds, key=lambda task: keys[task.task_id])
        return ranked[: max(1, math.ceil(self.config.top_fraction * len(self.seeds) - 1e-9))]

    def _new_variations(self, rng: random.Random, scores: dict[str, float]) -> list[Task]:
        """Ask for variations of the top seeds; keep those `check_variation` accepts."""
        wanted = self._variations_requested()
        if wanted <= 0 or self.write_variations is None:
            return []
        top = self._top_seeds(rng, scores)
        offered = {task.task_id: task for task in top}
        candidates = self.write_variations(top, wanted)
        known = {_asks(task) for task in self.pool.values()}
        accepted: list[Task] = []
        for candidate in candidates:  # a writer may offer more than asked: the first that pass
            origin = offered.get(candidate.task_id) or offered.get(candidate.task_id.rsplit("~", 1)[0])
            if origin is None:
                reason = (
                    f"candidate {candidate.task_id!r} names none of the offered seeds "
                    f"({', '.join(offered)}): its task_id must be its seed's"
                )
            else:
                reason = check_variation(candidate, origin, known, self.known_verbs)
            if reason is not None:
                logger.warning("curriculum rejected a variation: %s", reason)
                self.rejected += 1
                continue
            assert origin is not None and candidate.initial_state is not None
            task = Task(
                task_id=variation_id(origin, candidate.instruction, candidate.initial_state),
                instruction=candidate.instruction,
                env=origin.env,
                game_file=candidate.game_file,
                initial_state=candidate.initial_state,
                max_score=candidate.max_score if candidate.game_file else origin.max_score,
                start_score=candidate.start_score if candidate.game_file else origin.start_score,
            )
            self._add(task)
            known.add(_asks(task))
            accepted.append(task)
            self.accepted += 1
            if len(accepted) == wanted:
                break
        return accepted

    def _add(self, task: Task) -> None:
        if task.task_id in self.pool:
            raise ValueError(f"task id {task.task_id!r} is already in the pool")
        self.pool[task.task_id] = task
        self._stats[task.task_id] = deque(maxlen=self.config.window)

    # ------------------------------------------------------------ reporting and resuming

    def metrics(self) -> dict[str, float]:
        """Numbers to log per epoch (MLflow metrics)."""
        tried = [[s for _, s in stats] for stats in self._stats.values() if stats]
        entropies = [binary_entropy(sum(successes) / len(successes)) for successes in tried]
        return {
            "curriculum_entropy": sum(entropies) / len(entropies) if entropies else 0.0,
            "curriculum_score_mean": (sum(self.last_scores) / len(self.last_scores) if self.last_scores else 0.0),
            "curriculum_tasks": float(len(self.pool)),
            "curriculum_tried": float(len(tried)),
            "variations_accepted": float(self.accepted),
            "variations_rejected": float(self.rejected),
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, as JSON-serialisable values (variations as Task fields)."""
        seed_ids = {task.task_id for task in self.seeds}
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "variations": [dataclasses.asdict(task) for task_id, task in self.pool.items() if task_id not in seed_ids],
            "stats": {
                task_id: [[value, success] for value, success in stats]
                for task_id, stats in self._stats.items()
                if stats
            },
            "accepted": self.accepted,
            "rejected": self.rejected,
            "last_scores": list(self.last_scores),
        }

    @classmethod
    def from_state_dict(
        cls,
        state: dict[str, Any],
        seeds: Sequence[Task],
        config: CurriculumConfig,
        write_variations: WriteVariations | None = None,
        known_verbs: Iterable[str] | None = None,
    ) -> Curriculum:
        """A curriculum as it was when `state_dict` was taken, over the same seed tasks."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"curriculum state version {state.get('version')!r} is not "
                f"{STATE_VERSION}: it was written by another dreamgym version"
            )
        curriculum = cls(
            seeds, config, seed=int(state["seed"]), write_variations=write_variations, known_verbs=known_verbs
        )
        for fields in state["variations"]:
            curriculum._add(Task(**fields))
        missing = sorted(set(state["stats"]) - set(curriculum.pool))
        if missing:
            raise ValueError(
                f"the saved statistics name tasks that are not among the seeds: "
                f"{', '.join(missing[:5])}; resume with the seed tasks of that run"
            )
        for task_id, pairs in state["stats"].items():
            curriculum._stats[task_id].extend((float(value), bool(success)) for value, success in pairs)
        curriculum.accepted = int(state["accepted"])
        curriculum.rejected = int(state["rejected"])
        curriculum.last_scores = [float(score) for score in state["last_scores"]]
        return curriculum
