"""TextWorld adapter: plays a compiled `.z8` game and exposes the abstract textual state.

The state is built from the game's logical facts (not its prose), so it is exact and
deterministic: the player's room, the objects visible there (on supporters, inside open
containers, doors with their state and the way they lead, as the game's prose says "a closed
patio door leading east"), the inventory, and the game's admissible commands.
Reward is the increase of the game's score; `terminated` when the game is won or lost;
`truncated` at `max_steps`. An inadmissible or unknown command is a legal step that changes
nothing, as in the game itself.

The task instruction is the game's objective followed by its recipe: every cooking game has the
same objective text ("check the cookbook ..."), so the recipe is what tells tasks apart.

`expert_action` is the first command of the walkthrough TextWorld plans again after every step
(its `policy_commands`). Where its planner loops (`WALKTHROUGH_LIMIT`), the rest of the episode
has none: `expert_action` is None, and the game plays on as before.
"""

from __future__ import annotations

import json
import re
import warnings
from functools import lru_cache
from pathlib import Path

from dreamgym.envs.base import EnvError, GameFileError, Info, StepResult, Task, check_step_call
from dreamgym.state import AbstractState, format_item, format_state

ENV_NAME = "textworld"

# Unary facts that describe what a player can see change: door/container state, how food was cut
# or cooked. Static properties (edible, cuttable, ...) and defaults (raw, uncut) are left out.
_STATE_PREDICATES = ("locked", "closed", "open", "sliced", "diced", "chopped", "roasted", "fried", "grilled", "burned")
_HIDDEN_TYPES = {"P", "I", "r", "RECIPE", "ingredient"}
# `east_of(b, a)`: room b lies east of room a.
_DIRECTION_FACTS = {f"{way}_of": way for way in ("north", "south", "east", "west")}
_Z8_HEADER_BYTES = 64
# TextWorld (1.7) plans its walkthrough by popping the leaves of a tree of the quests' actions
# (`ActionDependencyTree.flatten`), pushing back the reverse of each move it pops that undoes a
# step of another quest. After some wandering two quests can push each other's moves back for
# ever: `go south, go south, go north, go north, ...`, and `step` never returned (an RL policy's
# 41st step in cooking-test-r2t2g9-okc-s9100016 hung a whole evaluation; tests/test_textworld_env.py
# replays it). A walkthrough this long is such a loop: these games' walkthroughs are a few dozen
# actions, and 1000 pops take ~0.2 s.
WALKTHROUGH_LIMIT = 1000


class _WalkthroughLoop(Exception):
    """TextWorld's walkthrough planner went past `WALKTHROUGH_LIMIT` actions."""


def _bound_walkthroughs() -> None:
    """Make TextWorld's walkthrough planner stop at `WALKTHROUGH_LIMIT` actions (once per process).

    A planner that loops raises `_WalkthroughLoop`; caught where a game's progression is updated
    or its walkthrough asked for, it ends the quest tracking of that game's episode (as TextWorld's
    own `GameProgression(track_quests=False)`), so the walkthrough is None till the next reset.
    The world's state, the admissible commands, the score and the win or loss do not come from
    the quests: they stay exact."""
    from textworld.generator.game import ActionDependencyTree, GameProgression

    if getattr(ActionDependencyTree.flatten, "bounded", False):
        return
    flatten, update, winning_policy = (
        ActionDependencyTree.flatten,
        GameProgression.update,
        GameProgression.winning_policy.fget,
    )

    def bounded_flatten(tree):
        for count, action in enumerate(flatten(tree)):
            if count == WALKTHROUGH_LIMIT:
                raise _WalkthroughLoop
            yield action

    def guarded_update(progression, action):
        try:
            update(progression, action)  # the world's state first, then the quests
        except _WalkthroughLoop:
            progression.quest_progressions = []

    def guarded_winning_policy(progression):
        try:
            return winning_policy(progression)
        except _WalkthroughLoop:
            progression.quest_progressions = []
            return None

    bounded_flatten.bounded = True
    ActionDependencyTree.flatten = bounded_flatten
    GameProgression.update = guarded_update
    GameProgression.winning_policy = property(guarded_winning_policy)


def check_game_file(game_file: str | Path) -> Path:
    """Reject a missing or corrupt game before the Z-machine sees it.

    A corrupt story file makes the interpreter call exit() and take the whole process down, so
    the header (version, declared length, checksum) is checked here first.
    """
    path = Path(game_file)
    if path.suffix != ".z8":
        raise GameFileError(f"game file {path}: expected a TextWorld '.z8' game")
    if not path.is_file():
        raise GameFileError(f"game file {path} does not exist; generate games with `dreamgym games`")
    story = path.read_bytes()
    if len(story) < _Z8_HEADER_BYTES or story[0] != 8:
        raise GameFileError(f"game file {path} is not a Z-machine version 8 story; regenerate it")
    declared_length = int.from_bytes(story[0x1A:0x1C], "big") * 8
    declared_checksum = int.from_bytes(story[0x1C:0x1E], "big")
    if declared_length > len(story):
        raise GameFileError(f"game file {path} is truncated ({len(story)} of {declared_length} bytes); regenerate it")
    if sum(story[_Z8_HEADER_BYTES:declared_length]) % 0x10000 != declared_checksum:
        raise GameFileError(f"game file {path} is corrupt (checksum mismatch); regenerate it")
    metadata = path.with_suffix(".json")
    if not metadata.is_file():
        raise GameFileError(
            f"game file {path} has no {metadata.name} beside it (TextWorld needs "
            "it for facts and admissible commands); regenerate the game"
        )
    try:
        json.loads(metadata.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise GameFileError(f"{metadata} is not valid JSON ({error}); regenerate the game") from None
    return path


@lru_cache(maxsize=1024)
def _read_task(path: str, mtime_ns: int) -> Task:
    game = json.loads(Path(path).with_suffix(".json").read_text())
    metadata = game.get("metadata", {})
    objective = " ".join(game.get("objective", "").split())
    recipe = compact_recipe(metadata.get("recipe", ""))
    instruction = f"{objective} {recipe}".strip()
    return Task(task_id=Path(path).stem, instruction=instruction, env=ENV_NAME, game_file=path)


def load_task(game_file: str | Path) -> Task:
    """The task a game file poses (its id is the file's stem)."""
    path = check_game_file(game_file).resolve()
    return _read_task(str(path), path.stat().st_mtime_ns)


def compact_recipe(recipe_text: str) -> str:
    """'Ingredients:\\n a\\n b\\n\\nDirections:\\n x\\n y' -> 'Recipe: ingredients: a, b. directions: x; y.'"""
    sections = re.split(r"\n\s*(Ingredients|Directions):\s*\n", recipe_text)
    parts = {}
    for heading, body in zip(sections[1::2], sections[2::2]):
        items = [line.strip() for line in body.strip().splitlines() if line.strip()]
        parts[heading.lower()] = items
    if not parts:
        return ""
    return (
        f"Recipe: ingredients: {', '.join(parts.get('ingredients', []))}. "
        f"directions: {'; '.join(parts.get('directions', []))}."
    )


def state_from_facts(facts, admissible_commands) -> AbstractState:
    """Build the abstract state from TextWorld facts (`Proposition`s) and admissible commands."""
    unary: dict[str, list[str]] = {}
    placed_at: dict[str, str] = {}  # object -> room
    placed_on: dict[str, str] = {}  # object -> supporter
    placed_in: dict[str, str] = {}  # object -> container (or "I" for the inventory)
    doors: dict[str, list[tuple[str, str]]] = {}  # room -> (door, the room it leads to)
    ways: dict[tuple[str, str], str] = {}  # (room, neighbour) -> the way from room to neighbour
    types: dict[str, str] = {}
    room = None
    for fact in facts:
        args = fact.arguments
        for arg in args:
            types[arg.name] = arg.type
        names = [arg.name for arg in args]
        if fact.name == "at" and names[0] == "P":
            room = names[1]
        elif fact.name == "at":
            placed_at[names[0]] = names[1]
        elif fact.name == "on":
            placed_on[names[0]] = names[1]
        elif fact.name == "in" and args[0].type not in _HIDDEN_TYPES:
            placed_in[names[0]] = names[1]
        elif fact.name == "link":
            doors.setdefault(names[0], []).append((names[1], names[2]))
        elif fact.name in _DIRECTION_FACTS:
            ways[(names[1], names[0])] = _DIRECTION_FACTS[fact.name]
        elif len(args) == 1 and fact.name in _STATE_PREDICATES:
            unary.setdefault(names[0], []).append(fact.name)
    if room is None:
        raise EnvError("the game's facts do not say where the player is")

    def describe(name: str, where: str | None = None) -> str:
        descriptors = sorted(set(unary.get(name, [])), key=_STATE_PREDICATES.index)
        return format_item(name, descriptors + ([where] if where else []))

    def is_closed(container: str) -> bool:
        return "open" not in unary.get(container, []) and types.get(container) in {"c", "oven", "d"}

    in_room = {name for name, where in placed_at.items() if where == room}
    visible = [describe(name) for name in in_room]
    visible += [describe(door, ways.get((room, beyond))) for door, beyond in doors.get(room, [])]
    for thing, supporter in placed_on.items():
        if supporter in in_room:
            visible.append(describe(thing, f"on {supporter}"))
    for thing, container in placed_in.items():
        if container in in_room and not is_closed(container):
            visible.append(describe(thing, f"in {container}"))
    inventory = [describe(name) for name, where in placed_in.items() if where == "I"]
    return AbstractState(
        location=room,
        visible=tuple(set(visible)),
        inventory=tuple(inventory),
        actions=tuple(sorted(set(admissible_commands))),
    )


class TextWorldEnv:
    """One TextWorld game at a time, reset to any task (game file)."""

    name = ENV_NAME

    def __init__(self, max_steps: int = 50):
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.max_steps = max_steps
        self._game = None
        self._game_file: str | None = None
        self._task: Task | None = None
        self._steps = 0
        self._score = 0
        self._done = True
        self._last_state = None

    def reset(self, task: Task) -> tuple[str, Info]:
        import textworld  # slow import, only when a game is played

        _bound_walkthroughs()
        if task.game_file is None:
            raise EnvError(f"task {task.task_id} has no game file; TextWorld tasks come from `load_task(game_file)`")
        game_file = str(check_game_file(task.game_file))
        if game_file != self._game_file:
            self.close()
            infos = textworld.EnvInfos(
                facts=True,
                admissible_commands=True,
                policy_commands=True,
                won=True,
                lost=True,
                score=True,
                max_score=True,
                objective=True,
            )
            with warnings.catch_warnings():
                # Jericho does not know TextWorld's generated games and says so on every load;
                # scores come from TextWorld's own state tracking, which is exact.
                warnings.simplefilter("ignore", UserWarning)
                self._game = textworld.start(game_file, request_infos=infos)
            self._game_file = game_file
        self._task = task
        game_state = self._game.reset()
        self._steps, self._score, self._done = 0, int(game_state["score"]), False
        return self._observe(game_state)

    def step(self, action: str) -> StepResult:
        check_step_call(self._task is not None, self._done, action)
        game_state, score, _ = self._game.step(" ".join(action.split()) or "look")
        self._steps += 1
        reward = float(int(score) - self._score)
        self._score = int(score)
        terminated = bool(game_state["won"] or game_state["lost"])
        truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or truncated
        observation, info = self._observe(game_state)
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
        self._game, self._game_file = None, None

    def _observe(self, game_state) -> tuple[str, Info]:
        state = state_from_facts(game_state["facts"], game_state["admissible_commands"])
        policy = game_state["policy_commands"] or []
        info = {
            "won": bool(game_state["won"]),
            "lost": bool(game_state["lost"]),
            "score": int(game_state["score"]),
            "max_score": int(game_state["max_score"]),
            "expert_action": policy[0] if policy else None,
            "feedback": game_state["feedback"],
            "task_id": self._task.task_id,
            "step": self._steps,
        }
        return format_state(state), info
