"""What the policy reads at one decision: the prompt, and the actions it scores.

A small policy trained on a few dozen games learns their objects by name: it "knows" to slice the
carrot and has nothing to say about a purple potato, so it wins the games it was trained on and
almost none of the held-out ones (whose foods it never saw). What to do with an object does not
depend on its name but on its role: named by the task or not. So, with placeholders on, every
game-specific object the state shows is renamed in the prompt and in the candidate actions:

- an object the task names becomes `obj1`, `obj2`, ... in the order the task first names them;
  the objects the task asks for (`policy.domain`'s `task_objects`: the recipe's ingredients) are
  numbered so from the first step, seen or not, so the recipe's first ingredient is always `obj1`.
  Numbering only what the state shows made a food's number depend on what the policy had found:
  with the first ingredient still in the closed fridge, the second was `obj1` and the recipe read
  `fry the yellow onion; ...; roast the obj1`, and the policy fried `obj1` (the first cooking verb
  of the recipe) (measured: results log, 2026-11-27);
- any other game-specific object becomes `other1`, `other2`, ... in the state's order.

"Game-specific" is the experience model's rule (`experience.placeholders.kept_names`, learnt from
the training data): rooms, furniture, doors and the objects of most games (knife, cookbook, meal)
keep their names; everything else that is carried or can be taken is renamed, foods the training
data never showed included. The renaming is done per decision from what the state shows, so the
environment, the data and the experience model keep the real names; the chosen action is mapped
back to its real text by position.

With `avoid_repeats` on, the candidates are the actions the episode took least often from the very
same state (so, while any is left, those it never took there): the games are deterministic, so an
action taken again from the same state can only lead where it led before, and a greedy policy that
meets a state twice would otherwise loop between two rooms until the step limit (measured:
results log, 2026-11-25). When every action was tried once, those
tried once are next: the policy keeps exploring rather than settling into a cycle.

`policy_input` is the one place the prompt and the candidates are made, for behaviour cloning and
for acting alike, so that the two can never drift apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from dreamgym.domain import Domain
from dreamgym.placeholders import carried_names, shown_names
from dreamgym.policy.config import PolicyConfig
from dreamgym.renaming import Renamer
from dreamgym.state import parse_state

PROMPT_END = "next action:"
TASK_OBJECT = "obj{}"
OTHER_OBJECT = "other{}"


def policy_prompt(
    instruction: str, recent_actions: Sequence[str], state: str, list_actions: bool = True, task_last: bool = True
) -> str:
    """The prompt for choosing the next action:

        recent actions: <a1> | <a2>          ("none" at the start of an episode)
        location: ...                        (the abstract state, dreamgym.state)
        visible: ...
        inventory: ...
        actions: ...                         (only with `list_actions`)
        task: <instruction>
        next action:

    The task comes last, next to the candidate actions that must be read against it: the policy
    finds the recipe's clause for an object at a fixed distance back from the candidate, whatever
    the state shows. With the task first, that distance grew with every object in sight, and a
    2-layer policy read the wrong clause: three more foods in the fridge turned `roast the obj1`
    into `cook obj1 with stove` (p 0.998 against 0.003), and BC won 38 of 100 headroom games
    where the same data, task last, won 49 (measured: results log, 2026-12-05, late night).
    `task_last=False` is that older layout, for the policies trained on it (`policy.task_last`).

    A policy that scores every available action (mode choice) does not need them listed: each is
    read as a candidate completion, and the list would be half the prompt's tokens.
    """
    recent = " | ".join(recent_actions) if recent_actions else "none"
    if not list_actions:
        state = "\n".join(line for line in state.split("\n") if not line.startswith("actions:"))
    task, context = f"task: {instruction}", f"recent actions: {recent}\n{state}"
    return "\n".join((context, task, PROMPT_END) if task_last else (task, context, PROMPT_END))


def object_placeholders(
    kept: frozenset[str], instruction: str, state: str, task_objects: Sequence[str] = ()
) -> dict[str, str]:
    """Real name -> placeholder for the objects the task asks for (`task_objects`, in its order)
    and the game-specific objects `state` shows (module docstring)."""
    abstract = parse_state(state)
    carried = carried_names(abstract)
    asked = [name for name in dict.fromkeys(task_objects) if name not in kept]
    names = list(dict.fromkeys(name for name in shown_names(abstract) if name in carried and name not in kept))
    finder = Renamer({name: name for name in names if name not in asked})
    in_task = asked + list(dict.fromkeys(finder.occurrences(instruction)))
    others = [name for name in names if name not in in_task]
    mapping = {name: TASK_OBJECT.format(number) for number, name in enumerate(in_task, 1)}
    mapping.update({name: OTHER_OBJECT.format(number) for number, name in enumerate(others, 1)})
    return mapping


@dataclass(frozen=True)
class PolicyInput:
    """One decision as the policy model sees it: `candidates[i]` is `actions[i]` renamed."""

    prompt: str
    candidates: tuple[str, ...]  # the texts scored
    actions: tuple[str, ...]  # the real actions, in the same order
    mapping: dict[str, str]  # real name -> placeholder ({} without placeholders)

    def rename(self, action: str) -> str:
        """An action (e.g. a training label) as the model reads it."""
        return Renamer(self.mapping).text(action)

    def restore(self, text: str) -> str:
        """A text the model wrote (mode generate) with the real names back."""
        return Renamer({placeholder: name for name, placeholder in self.mapping.items()}).text(text)


def least_tried(
    actions: Sequence[str], state: str, past_states: Sequence[str], past_actions: Sequence[str]
) -> tuple[str, ...]:
    """Those of `actions` that the episode took least often from this very `state`
    (`past_actions[i]` was taken from `past_states[i]`): the untried ones while any is left."""
    tried = Counter(action for before, action in zip(past_states, past_actions, strict=True) if before == state)
    fewest = min(tried[action] for action in actions)
    return tuple(action for action in actions if tried[action] == fewest)


def policy_input(
    instruction: str,
    recent_actions: Sequence[str],
    state: str,
    history: int,
    kept: frozenset[str] | None,
    list_actions: bool = True,
    past_states: Sequence[str] | None = None,
    task_objects: Sequence[str] = (),
    task_last: bool = True,
    denied: Collection[str] = (),
) -> PolicyInput:
    """The prompt and candidates of one decision: the last `history` actions taken, and with
    `kept` (placeholders on) every game-specific object renamed, the objects the task asks for
    (`task_objects`, real names in the task's order) first. With `past_states` (the
    state each of `recent_actions` was taken from: `avoid_repeats` on) the candidates are the
    actions taken least often from `state` (module docstring). `denied` actions are left out of
    the candidates while any other is available (RL's rollouts: moves that lost from this state,
    `dreamgym.rl.rollout.play_groups`)."""
    recent = list(recent_actions[-history:]) if history else []
    actions = parse_state(state).actions or ("look",)
    if denied:
        actions = tuple(action for action in actions if action not in denied) or actions
    if past_states is not None:
        actions = least_tried(actions, state, past_states, recent_actions)
    if kept is None:
        return PolicyInput(
            policy_prompt(instruction, recent, state, list_actions, task_last), tuple(actions), tuple(actions), {}
        )
    mapping = object_placeholders(kept, instruction, state, task_objects)
    renamer = Renamer(mapping)
    prompt = policy_prompt(
        renamer.text(instruction),
        [renamer.text(action) for action in recent],
        renamer.state(state),
        list_actions,
        task_last,
    )
    return PolicyInput(prompt, tuple(renamer.text(action) for action in actions), tuple(actions), mapping)


def configured_input(
    config: PolicyConfig,
    domain: Domain,
    kept: frozenset[str] | None,
    instruction: str,
    recent_actions: Sequence[str],
    state: str,
    past_states: Sequence[str] | None,
    denied: Collection[str] = (),
) -> PolicyInput:
    """`policy_input` under a policy's prompt settings (`config`, its `domain`'s task objects): the
    one place behaviour cloning's examples and acting read those settings, so that a new one
    cannot reach the one and miss the other."""
    return policy_input(
        instruction,
        recent_actions,
        state,
        config.history,
        kept,
        list_actions=config.mode == "generate",
        past_states=past_states if config.avoid_repeats else None,
        task_objects=domain.task_objects(instruction),
        task_last=config.task_last,
        denied=denied,
    )
