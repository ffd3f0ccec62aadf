"""ScienceWorld adapter: plays a task file (`tasks.py`) in ScienceWorld's JVM through the `Env` contract.

The observation is the abstract state of `observation.py`. Reward is the increase of
ScienceWorld's score, to the hundredth (0-100; a task starts with the credit its first subgoals
give, and a wrong `focus on` ends it at -100); `terminated` when the task is completed or failed;
`truncated` at `max_steps`. An action ScienceWorld does not know is a legal step that changes
nothing, as there.

The expert (`info["expert_action"]`) is the task's gold path, each of its actions matched to the
valid action that acts on the same things (`observation.resolved_action`: the gold path names
things its own way, 'living thing in flower pot 6' for what the valid actions call 'adult peach
tree'); gold steps that change nothing, opening a door that stands open, are skipped. It
follows the episode while the episode follows it: an action off the path that changes nothing
the state shows (looking around) keeps it; any other ends it (None), as ScienceWorld has no
planner to say what to do from an unplanned state.

One JVM per adapter, started at the first reset. If it dies (killed, out of memory), the running
episode ends in `ScienceWorldError`, never a hang, and the next `reset` starts a new one, so a
collection or an evaluation goes on with the next task.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from dreamgym.envs.base import EnvCrashed, EnvError, Info, StepResult, Task, check_step_call
from dreamgym.envs.scienceworld.observation import (
    FIND_VERBS,
    abstract_state,
    as_offered,
    as_played,
    objects_of,
    parent_ids,
    resolved_action,
    verb_of,
)
from dreamgym.envs.scienceworld.tasks import ENV_NAME, read_spec
from dreamgym.state import format_state

MAX_SCORE = 100
AMBIGUOUS = "Ambiguous request"  # how ScienceWorld asks which of several things an action meant
# One JVM per environment, and RL's rollouts and its dream-vs-real check step 32 side by side.
# With Java's defaults a JVM grew to ~840 MB over 30 episodes, and 32 of them ran a 23 GB machine
# out of memory; with these it stays at ~245 MB at the same speed (16-17 steps/s; measured:
# results log, 2026-12-05). Without the JIT's second tier it is ~190 MB but half as fast.
JVM_OPTIONS = "-Xmx160m -XX:+UseSerialGC -XX:ReservedCodeCacheSize=48m -Xss512k"
# ScienceWorld's own step limit is set out of the way: the adapter truncates at `max_steps`.
_BACKEND_STEP_LIMIT = 10**6


class ScienceWorldError(EnvCrashed):
    """ScienceWorld's JVM could not be started or stopped answering."""


def started_backend():
    """A ScienceWorld instance with its own JVM."""
    try:
        from scienceworld import ScienceWorldEnv as Backend
    except ImportError:
        raise ScienceWorldError("the scienceworld package is not installed: run `make install`") from None
    before = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{before} {JVM_OPTIONS}" if before else JVM_OPTIONS  # read at the JVM's start
    try:
        return Backend("", envStepLimit=_BACKEND_STEP_LIMIT)
    except Exception as error:  # py4j and subprocess errors alike: Java missing or unable to start
        raise ScienceWorldError(
            f"ScienceWorld's JVM did not start ({type(error).__name__}: {error}); it needs Java 17 or later on the PATH"
        ) from None
    finally:
        if before is None:
            del os.environ["JAVA_TOOL_OPTIONS"]
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = before


def _is_gateway_error(error: Exception) -> bool:
    return type(error).__module__.startswith("py4j")


class ScienceWorldEnv:
    """One ScienceWorld task at a time, reset to any task file."""

    name = ENV_NAME

    def __init__(self, max_steps: int = 50, verbs: Sequence[str] = FIND_VERBS, expert: bool = True):
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.max_steps = max_steps
        self.verbs = tuple(verbs)
        self.expert = expert  # off: `expert_action` is None (evaluation and RL need none; it costs ~0.1 s a step)
        self._backend = None
        self._task: Task | None = None
        self._done = True
        self._steps = 0
        self._exact = 0.0  # the score to the hundredth
        self._gold: list[str] = []
        self._next_gold = 0
        self._on_path = False
        self._expert_now: str | None = None
        self._gold_now: str | None = None  # the gold path's action the expert is on
        self._state = None
        self._valid: list[str] = []

    def reset(self, task: Task) -> tuple[str, Info]:
        if task.game_file is None:
            raise EnvError(f"task {task.task_id} has no task file; ScienceWorld tasks come from `load_task(path)`")
        spec = read_spec(task.game_file)
        try:
            observation, info = self._load(spec)
        except Exception as error:
            if not _is_gateway_error(error):
                raise
            self.close()  # a dead JVM: one new start, then the error is the answer
            try:
                observation, info = self._load(spec)
            except Exception as again:
                if not _is_gateway_error(again):
                    raise
                raise ScienceWorldError(
                    f"ScienceWorld's JVM does not answer ({again}); it was restarted once"
                ) from None
        self._task, self._done, self._steps = task, False, 0
        self._exact = self._exact_score()
        self._gold = list(self._backend.get_gold_action_sequence()) if self.expert else []
        self._next_gold, self._on_path = 0, self.expert

        observation, out = self._observe(info, "")
        return observation, self._with_expert(out)

    def _load(self, spec):
        if self._backend is None:
            self._backend = started_backend()
        self._backend.load(spec.task, spec.variation, spec.simplification, generateGoldPath=self.expert)
        return self._backend.reset()

    def step(self, action: str) -> StepResult:
        check_step_call(self._task is not None, self._done, action)
        before, expert = self._state, self._expert_now
        try:
            feedback, _, completed, info = self._backend.step(as_played(" ".join(action.split())) or "look around")
            if feedback.startswith(AMBIGUOUS):
                # A name several things answer to (the valid actions name things differently at each
                # step): ScienceWorld waits for a number, and offers only numbers until it has one.
                # Its first reading is taken, so that every step ends in a state that offers actions.
                feedback, _, completed, info = self._backend.step("0")
            exact = self._exact_score()
        except Exception as error:
            if not _is_gateway_error(error):
                raise
            self._done = True
            self.close()
            raise ScienceWorldError(
                f"ScienceWorld's JVM stopped during task {self._task.task_id} ({type(error).__name__}); "
                "this episode is lost, and the next reset() starts a new JVM"
            ) from None
        self._steps += 1
        score = int(info["score"])
        # The score's increase to the hundredth, as ScienceWorld keeps it: one subgoal of twelve is
        # always 8.33, where the whole numbers it reports made it 8 or 9 by what came before.
        reward, self._exact = round(exact - self._exact, 2), exact
        terminated = bool(completed) or score >= MAX_SCORE or score < 0
        truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or truncated
        observation, out = self._observe(info, feedback)
        if action == expert:
            self._next_gold += action == self._gold_now  # not for a pick-up the expert put before a move
        elif (before.location, before.visible, before.inventory) != (
            self._state.location,
            self._state.visible,
            self._state.inventory,
        ):
            self._on_path = False
        return observation, reward, terminated, truncated, self._with_expert(out)

    def _exact_score(self) -> float:
        return 100 * self._backend.server.getScore()  # what ScienceWorld rounds into info["score"]

    def _observe(self, info: dict, feedback: str) -> tuple[str, Info]:
        self._valid = list(info["valid"])
        self._state = abstract_state(info["look"], info["inv"], self._valid, self.verbs, self._task.instruction)
        score = int(info["score"])
        out = {
            "won": score >= MAX_SCORE,
            "lost": score < 0,
            "score": score,
            "max_score": MAX_SCORE,
            "expert_action": None,
            "feedback": feedback,
            "task_id": self._task.task_id,
            "step": self._steps,
        }
        return format_state(self._state), out

    def _with_expert(self, info: Info) -> Info:
        self._expert_now = None if self._done else self._expert()
        return {**info, "expert_action": self._expert_now}

    def _expert(self) -> str | None:
        """The gold path's next action that changes something, as the state offers it."""
        while self._on_path and self._next_gold < len(self._gold):
            gold = self._gold[self._next_gold]
            action = gold if gold in self._valid else self._resolved(gold)
            if action is not None:
                self._gold_now = as_offered(action)
                return self._carried_first(self._gold_now)
            self._next_gold += 1
        return None

    def _carried_first(self, action: str) -> str:
        """`action`, or, where it moves a thing the agent does not carry (the state offers moves of
        carried things only), the action that picks that thing up first."""
        if verb_of(action) != "move" or action in self._state.actions:
            return action
        pick_up = f"pick up {objects_of(action)[0]}"
        return pick_up if pick_up in self._state.actions else action

    def _resolved(self, gold: str) -> str | None:
        verb = verb_of(gold)
        if not any(verb_of(action) == verb for action in self._valid):
            return None  # nothing to resolve to (no door is closed to be opened): no call to the JVM
        backend = self._backend
        templates = [(t["action"], t["obj_ids"]) for t in backend.get_valid_action_object_combinations_with_templates()]
        referents = {int(i): v["referents"] for i, v in backend.get_all_object_ids_types_referents_LUTJSON().items()}
        return resolved_action(gold, templates, referents, lambda: parent_ids(backend.getObjectTree()))

    def close(self) -> None:
        if self._backend is not None:
            with contextlib.suppress(Exception):  # a JVM already dead has nothing left to close
                self._backend.close()
        self._backend = None
