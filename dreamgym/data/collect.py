"""Collect offline trajectories from real games with a behaviour policy.

Behaviour policies:
- `expert`: the game's own next walkthrough action from the current state;
- `noisy-expert`: a random admissible action with probability epsilon, otherwise the expert's
  next action *from the current state* (so it recovers from its own detours when it can, and
  sometimes cannot: the data holds successes and failures, as the paper's offline data does);
- `random`: a uniformly random admissible action.

Besides, `mistake_episodes` per game follow the expert but make, at one step, a mistake the
environment's rules name (`Domain.mistakes`: slicing what the recipe says to dice), then go on
with the expert if the game goes on. A random action is rarely such a mistake (2 of some 30
admissible ones), so the behaviour policy's data shows few of them, and an experience model that
has seen none imagines that they work: a policy trained in it learnt to chop what its recipe said
to slice or dice (measured: results log, 2026-11-26).

Every episode has its own random stream seeded from (seed, task, episode), so a collection is
reproducible whatever the number of worker processes. The settings and the games' digests are
stored in the Parquet file's metadata; collecting again with the same ones reuses the file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import multiprocessing
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from dreamgym.config import PipelineConfig
from dreamgym.data.config import POLICIES
from dreamgym.data.schema import (
    MISTAKE_POLICY,
    content_hash,
    read_metadata,
    read_transitions,
    to_table,
    trajectory_id,
    write_transitions,
)
from dreamgym.domain import named_domain
from dreamgym.envs.base import Env, EnvCrashed, Task
from dreamgym.envs.real import environment_of, list_games, load_task, real_env
from dreamgym.errors import DreamgymError
from dreamgym.state import parse_state


@dataclass(frozen=True)
class CollectionSettings:
    """What determines a collection's content (and so whether an existing file can be reused)."""

    policy: str
    epsilon: float
    episodes_per_game: int
    seed: int
    max_steps: int
    mistake_episodes: int = 0  # per game: the expert with one mistake the domain names
    domain: str = "none"  # whose rules name the mistakes (dreamgym/domain.py)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise DreamgymError(f"unknown policy {self.policy!r}: use one of {', '.join(POLICIES)}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise DreamgymError(f"epsilon must be between 0 and 1, got {self.epsilon}")
        if self.episodes_per_game < 1:
            raise DreamgymError(f"episodes per game must be at least 1, got {self.episodes_per_game}")
        if self.mistake_episodes < 0:
            raise DreamgymError(f"mistake episodes per game must be at least 0, got {self.mistake_episodes}")

    @classmethod
    def from_config(cls, config: PipelineConfig) -> CollectionSettings:
        return cls(
            policy=config.collect.policy,
            epsilon=config.collect.epsilon,
            episodes_per_game=config.collect.episodes_per_game,
            seed=config.seed,
            max_steps=config.env.max_steps,
            mistake_episodes=config.collect.mistake_episodes,
            domain=config.collect.domain,
        )

    @property
    def policy_label(self) -> str:
        return f"noisy-expert(epsilon={self.epsilon:g})" if self.policy == "noisy-expert" else self.policy


@dataclass(frozen=True)
class CollectionResult:
    path: str
    transitions: int
    trajectories: int
    success_rate: float
    mean_steps: float
    seconds: float
    reused: bool


def choose_action(
    policy: str, rng: random.Random, epsilon: float, available: Sequence[str], expert_action: str | None
) -> str:
    """The behaviour policy's action. Without an expert plan (a lost or unwinnable game) the
    expert policies act at random, as there is nothing better to imitate."""
    if not available:
        return "look"
    if policy == "random" or expert_action is None:
        return rng.choice(list(available))
    if policy == "noisy-expert" and rng.random() < epsilon:
        return rng.choice(list(available))
    return expert_action


def play_episode(
    env: Env, task: Task, settings: CollectionSettings, episode: int, run_id: str | None = None
) -> list[dict]:
    """One episode of the behaviour policy as transition records."""
    rng = random.Random(f"{settings.seed}|{task.task_id}|{episode}")

    def behaviour(step: int, available: Sequence[str], expert_action: str | None) -> str:
        return choose_action(settings.policy, rng, settings.epsilon, available, expert_action)

    traj = trajectory_id(env.name, task.task_id, settings.policy_label, settings.seed, episode)
    return _play(env, task, traj, settings.policy_label, behaviour, run_id)


def play_mistake_episodes(env: Env, task: Task, settings: CollectionSettings, run_id: str | None = None) -> list[dict]:
    """Up to `settings.mistake_episodes` episodes of the expert that each make another of the
    mistakes `settings.domain` names for the expert's path (its step and its action drawn at
    random), as transition records; none where the domain names no mistake on that path."""
    domain = named_domain(settings.domain)
    chances = []  # (step, mistake) along the expert's path
    state, info = env.reset(task)
    for step in range(env.max_steps):
        expert_action = info["expert_action"]
        if expert_action is None:
            break
        available = parse_state(state).actions
        chances += [(step, m) for m in domain.mistakes(task.instruction, expert_action) if m in available]
        state, _, terminated, truncated, info = env.step(expert_action)
        if terminated or truncated:
            break
    rng = random.Random(f"{settings.seed}|{task.task_id}|mistakes")
    rows = []
    for at, mistake in rng.sample(chances, min(settings.mistake_episodes, len(chances))):
        traj = trajectory_id(env.name, task.task_id, MISTAKE_POLICY, settings.seed, at, mistake)
        rows += _play(env, task, traj, MISTAKE_POLICY, functools.partial(_expert_but_once, at, mistake, rng), run_id)
    return rows


def _expert_but_once(
    at: int, mistake: str, rng: random.Random, step: int, available: Sequence[str], expert: str | None
) -> str:
    """The action of a mistake episode: `mistake` at step `at`, the expert's everywhere else."""
    return mistake if step == at else choose_action("expert", rng, 0.0, available, expert)


def _play(
    env: Env,
    task: Task,
    traj: str,
    policy_label: str,
    act: Callable[[int, Sequence[str], str | None], str],
    run_id: str | None,
) -> list[dict]:
    """One episode in which `act(step, available actions, the expert's action)` chooses each action."""
    state, info = env.reset(task)
    rows = []
    for step in range(env.max_steps):
        expert_action = info["expert_action"]
        action = act(step, parse_state(state).actions, expert_action)
        next_state, reward, terminated, truncated, info = env.step(action)
        row = {
            "env": env.name,
            "task_id": task.task_id,
            "instruction": task.instruction,
            "trajectory_id": traj,
            "step": step,
            "state": state,
            "action": action,
            "expert_action": expert_action,
            "next_state": next_state,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "won": info["won"],
            "lost": info["lost"],
            "score": info["score"],
            "max_score": info["max_score"],
            "reasoning": None,
            "source": "real",
            "policy": policy_label,
            "model_version": None,
            "run_id": run_id,
            "created_at": datetime.now(UTC),
        }
        row["content_hash"] = content_hash(row)
        rows.append(row)
        state = next_state
        if terminated or truncated:
            break
    return rows


# One real environment per process and kind, reused game after game: ScienceWorld's JVM takes
# seconds to start. `close_environments` closes them.
_ENVIRONMENTS: dict[tuple[str, int], Env] = {}


def _environment(game_file: str, max_steps: int) -> Env:
    key = (environment_of(game_file), max_steps)
    if key not in _ENVIRONMENTS:
        _ENVIRONMENTS[key] = real_env(key[0], max_steps, expert=True)
    return _ENVIRONMENTS[key]


def close_environments() -> None:
    while _ENVIRONMENTS:
        _ENVIRONMENTS.popitem()[1].close()


def collect_game(game_file: str, settings: CollectionSettings, run_id: str | None) -> list[dict]:
    """Every episode of one game, as transition records (a unit of work a pool or a Ray worker runs).
    Where the environment's process dies (`EnvCrashed`), the game is played again from its first
    episode, once: its rows are kept whole or not at all."""
    task = load_task(game_file)

    def every_episode() -> list[dict]:
        env = _environment(game_file, settings.max_steps)
        # From a fresh start, so that a game's rows do not depend on what this process played before:
        # ScienceWorld's gold path picks among the things that fit the task (which animal) from its
        # JVM's state, which every earlier step moved (and even so, not always alike from one JVM to
        # the next). A TextWorld game is loaded anew anyway.
        env.close()
        episodes = range(settings.episodes_per_game)
        rows = [row for episode in episodes for row in play_episode(env, task, settings, episode, run_id)]
        return rows + play_mistake_episodes(env, task, settings, run_id)

    try:
        return every_episode()
    except EnvCrashed:
        return every_episode()  # the environment's next reset starts its process again


def _games_digest(games: Sequence[Path]) -> list[list[str]]:
    return [[game.name, hashlib.md5(game.read_bytes()).hexdigest()] for game in games]


def plan_collection(
    games: Sequence[str | Path], out: Path, settings: CollectionSettings
) -> tuple[list[Path], dict, CollectionResult | None]:
    """The checked game files, the metadata a collection of them writes, and the collection
    already at `out` made the same way (None: collect it) — for `collect` and its pieces alike."""
    checked = [Path(load_task(game).game_file) for game in games]
    if not checked:
        raise DreamgymError("no games to collect from; generate games with `dreamgym games`")
    # format 2: rows record the expert's action; 3: a door says the way it leads; 4: ScienceWorld's
    # rewards to the hundredth, each game from a fresh environment (a file of an older format is
    # collected again)
    metadata = {"collection": asdict(settings), "games": _games_digest(checked), "format": 4}
    if out.exists() and read_metadata(out) == metadata:
        reused = CollectionResult(path=str(out), seconds=0.0, reused=True, **summarize(read_transitions(out)))
        return checked, metadata, reused
    return checked, metadata, None


def summarize(table: pa.Table) -> dict[str, float]:
    """Counts and success rate of a transitions table (success = the episode's last step won)."""
    last_steps = table.filter(pc.or_(table["terminated"], table["truncated"]))
    trajectories = len(set(table["trajectory_id"].to_pylist()))
    won = sum(last_steps["won"].to_pylist())
    return {
        "transitions": table.num_rows,
        "trajectories": trajectories,
        "success_rate": won / trajectories if trajectories else 0.0,
        "mean_steps": table.num_rows / trajectories if trajectories else 0.0,
    }


def collect(
    games: Sequence[str | Path],
    out: str | Path,
    settings: CollectionSettings,
    workers: int = 2,
    run_id: str | None = None,
    progress: bool = True,
) -> CollectionResult:
    """Play `settings.episodes_per_game` episodes on each game and write one Parquet file.

    An existing file made from the same games and settings is reused, not collected again.
    """
    out = Path(out)
    games, metadata, reused = plan_collection(games, out, settings)
    if reused:
        return reused

    started = time.perf_counter()
    rows_by_game: dict[str, list[dict]] = {}
    with tqdm(total=len(games), desc=f"collect → {out.name}", unit="game", disable=not progress) as bar:
        if workers == 1:  # no pool: a worker process costs seconds to start (it imports TextWorld)
            try:
                for game in games:
                    rows_by_game[str(game)] = collect_game(str(game), settings, run_id)
                    bar.update()
            finally:
                close_environments()
        else:
            context = multiprocessing.get_context("spawn")  # forking a threaded process is unsafe
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                futures = {pool.submit(collect_game, str(game), settings, run_id): game for game in games}
                for future in as_completed(futures):
                    rows_by_game[str(futures[future])] = future.result()
                    bar.update()
    table = to_table((row for game in games for row in rows_by_game[str(game)]), metadata)
    write_transitions(table, out)
    return CollectionResult(path=str(out), seconds=time.perf_counter() - started, reused=False, **summarize(table))


def held_out_collection(games_dir: str | Path, config: PipelineConfig) -> tuple[list[Path], CollectionSettings]:
    """The games and settings of `collect_held_out`."""
    games = list_games(games_dir)[: config.experience.eval_games or None]
    # The behaviour policy's episodes only: the fidelity figures stay comparable with earlier ones
    # (the dream on a policy's own episodes; measured: results log, 2026-11-25).
    settings = dataclasses.replace(
        CollectionSettings.from_config(config), episodes_per_game=1, seed=config.seed + 1, mistake_episodes=0
    )
    return games, settings


def collect_held_out(games_dir: str | Path, out: str | Path, config: PipelineConfig) -> str:
    """Real transitions to measure a model against (fidelity): one new episode on each of the
    first `experience.eval_games` games (0: all), with the data's behaviour policy but another
    seed, so they are never episodes it trained on. Reused when collected with the same settings."""
    games, settings = held_out_collection(games_dir, config)
    return collect(games, out, settings, workers=config.collect.workers).path
