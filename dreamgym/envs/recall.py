"""Dynamics that answer from the real transitions already recorded where they hold the answer, and
ask the learned model elsewhere.

RL in DreamEnv starts from the real initial states of the training tasks, and a policy cloned from
the offline data walks mostly where that data went: most of its steps repeat a recorded real step
(the same task, state and action). The experience model can at best reproduce such a step, and
where it gets it wrong the dream fails episodes the game would have won: GRPO then pushes the
policy away from what works (with recall the dream's success is close to the game's, without it
far below; measured: results log, 2026-11-29). The real outcome is known there; the model is
needed only where the data has not been (other actions, other states, the curriculum's
variations, whose instructions no recorded step has).

A step is recalled only when every recorded real transition of its (task, instruction, state,
action) had the same outcome (next state, reward, end): a game's hidden state (what a closed
container holds) can make one visible situation end in two ways, and then the model decides.
Recalled steps are not the model's predictions: DreamEnv counts them apart and does not write
them back to the buffer (they are real rows already).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dreamgym.envs.dynamics import Completion, Dynamics, Prediction, Query
from dreamgym.state import AbstractState, parse_state

_Key = tuple[str, str, AbstractState, str]  # task id, instruction, state, action


class RecallingDynamics:
    """`model`, except for the steps the recorded real transitions `rows` (buffer rows:
    task_id, instruction, state, action, next_state, reward, terminated) answer unambiguously."""

    def __init__(self, model: Dynamics, rows: Iterable[dict]):
        self.model = model
        outcomes: dict[_Key, set[tuple[AbstractState, float, bool]]] = {}
        for row in rows:
            key = (row["task_id"], row["instruction"], parse_state(row["state"]), row["action"])
            outcome = (parse_state(row["next_state"]), float(row["reward"]), bool(row["terminated"]))
            outcomes.setdefault(key, set()).add(outcome)
        self.known = {key: next(iter(found)) for key, found in outcomes.items() if len(found) == 1}
        self.ambiguous = len(outcomes) - len(self.known)
        self.recalled = 0  # queries answered from the recorded transitions, over this object's life
        self.asked = 0  # all queries

    @property
    def history(self) -> int:
        return self.model.history

    def predict(self, queries: Sequence[Query]) -> list[Prediction]:
        answers: list[Prediction | None] = [None] * len(queries)
        unknown = []
        for index, query in enumerate(queries):
            outcome = self.known.get((query.task_id, query.instruction, query.state, query.action))
            if outcome is None:
                unknown.append(index)
            else:
                answers[index] = Prediction(Completion(None, *outcome), "", attempts=0, recalled=True)
        if unknown:
            for index, prediction in zip(unknown, self.model.predict([queries[i] for i in unknown]), strict=True):
                answers[index] = prediction
        self.asked += len(queries)
        self.recalled += len(queries) - len(unknown)
        return answers  # type: ignore[return-value] - every slot is filled
