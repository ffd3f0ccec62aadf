"""How faithful the experience model is to the real environment, measured on real transitions.

The paper could only ask an LLM judge; we have the real game. For real transitions the model never
saw (held-out games), the model's prediction is compared with what the game did:
- single step: from the real state, history and action; next-state exact match, per-field F1
  (location, visible, inventory, available actions), reward and done accuracy, parse failures;
- open loop: a real episode's actions replayed through the model from its first state, each
  predicted state fed back as the next input (history included), compared step by step with the
  real states, for up to `horizon` steps. An unparsable prediction ends that replay; its remaining
  steps count as wrong.

Some transitions cannot be predicted from anything the model is shown: in a held-out game, going
into a room reveals what is there, opening a container what it holds. Each record says whether the
transition is `foreseeable` (every place and item name of the real next state appears in the
instruction, the current state or the history), and the summary gives the scores on those alone:
how close the model comes on what it could know, and the ceiling of exact match on the rest.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqdm import tqdm

from dreamgym.data.schema import episodes as by_episode
from dreamgym.data.schema import score_before
from dreamgym.envs.dynamics import Dynamics, Prediction, Query, Step
from dreamgym.experience.examples import queries_of
from dreamgym.state import AbstractState, item_name, parse_state

FIELDS = ("location", "visible", "inventory", "actions")


def set_f1(predicted: Sequence[str], real: Sequence[str]) -> float:
    predicted, real = set(predicted), set(real)
    if not predicted and not real:
        return 1.0
    overlap = len(predicted & real)
    return 2 * overlap / (len(predicted) + len(real))


def field_f1(predicted: AbstractState, real: AbstractState) -> dict[str, float]:
    scores = {"location": float(predicted.location == real.location)}
    for name in FIELDS[1:]:
        scores[name] = set_f1(getattr(predicted, name), getattr(real, name))
    return scores


def foreseeable(query: Query, real_next: AbstractState) -> bool:
    """Whether every place and item the real next state names is named in the query already (its
    instruction, state or history): otherwise no model could write that state from the prompt."""
    shown = "\n".join(
        [query.instruction, query.state.to_text(), *(f"{step.location}: {step.action}" for step in query.history)]
    )
    names = [real_next.location, *map(item_name, real_next.visible), *map(item_name, real_next.inventory)]
    return all(name in shown for name in names)


def real_done(row: dict) -> bool:
    """The environment ended the episode (a time limit is not part of the dynamics)."""
    return bool(row["terminated"])


def _score(prediction: Prediction, row: dict, query: Query) -> dict:
    """One example's record: what was predicted against what the game did."""
    real = parse_state(row["next_state"])
    record = {
        "task_id": row["task_id"],
        "trajectory_id": row["trajectory_id"],
        "step": row["step"],
        "action": row["action"],
        "foreseeable": foreseeable(query, real),
        "parsed": prediction.ok,
        "attempts": prediction.attempts,
        "error": prediction.error,
    }
    if prediction.ok:
        completion = prediction.completion
        record |= {
            "exact_match": completion.next_state == real,
            "reward_correct": abs(completion.reward - row["reward"]) < 1e-6,
            "done_correct": completion.done == real_done(row),
            **{f"f1_{name}": value for name, value in field_f1(completion.next_state, real).items()},
        }
    else:  # a failure is wrong on every count, never a guess
        record |= {
            "exact_match": False,
            "reward_correct": False,
            "done_correct": False,
            **{f"f1_{name}": 0.0 for name in FIELDS},
        }
    return record


def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start : start + size]


def single_step(model: Dynamics, rows: Sequence[dict], batch_size: int = 32, progress: bool = False) -> list[dict]:
    """Per-transition records for every real transition, from the real state and history."""
    ordered = [row for episode in by_episode(rows) for row in episode]
    # The queries the model's examples were built from: the same history, cut at a quarantined step.
    jobs = list(zip(ordered, queries_of(ordered, model.history)))
    records = []
    with tqdm(total=len(jobs), desc="fidelity: single step", unit="transition", disable=not progress) as bar:
        for batch in _batches(jobs, batch_size):
            for (row, query), prediction in zip(batch, model.predict([query for _, query in batch])):
                records.append(_score(prediction, row, query))
            bar.update(len(batch))
    return records


def open_loop(
    model: Dynamics, rows: Sequence[dict], horizon: int, batch_size: int = 32, progress: bool = False
) -> list[dict]:
    """Per step t (1..horizon): exact-match rate and field F1 of the t-th predicted state.

    All episodes advance together, one batched prediction per step.
    """
    episodes = [episode[:horizon] for episode in by_episode(rows)]
    states = [parse_state(episode[0]["state"]) for episode in episodes]
    histories: list[list[Step]] = [[] for _ in episodes]
    earlier: list[list[tuple[AbstractState, str]]] = [[] for _ in episodes]
    alive = [True] * len(episodes)
    per_step = []
    for t in tqdm(range(horizon), desc="fidelity: open loop", disable=not progress):
        active = [i for i, episode in enumerate(episodes) if len(episode) > t]
        if not active:
            break
        records = []
        running = [i for i in active if alive[i]]
        for batch in _batches(running, batch_size):
            queries = [
                Query(
                    episodes[i][t]["instruction"],
                    states[i],
                    episodes[i][t]["action"],
                    tuple(histories[i][-model.history :] if model.history else ()),
                    episodes[i][t]["trajectory_id"],
                    earlier=tuple(earlier[i]),
                    # the real start's score, then the predicted rewards'
                    score=score_before(episodes[i][0]) + sum(step.reward for step in histories[i]),
                )
                for i in batch
            ]
            for i, query, prediction in zip(batch, queries, model.predict(queries)):
                records.append(_score(prediction, episodes[i][t], query))
                if not prediction.ok:
                    alive[i] = False
                    continue
                histories[i].append(Step(episodes[i][t]["action"], prediction.completion.reward, states[i].location))
                earlier[i].append((states[i], episodes[i][t]["action"]))
                states[i] = prediction.completion.next_state
        dead = len(active) - len(running)
        n = len(active)
        per_step.append(
            {
                "step": t + 1,
                "episodes": n,
                "exact_match": sum(r["exact_match"] for r in records) / n,
                **{f"f1_{name}": sum(r[f"f1_{name}"] for r in records) / n for name in FIELDS},
                "stopped_by_parse_failure": dead,
            }
        )
    return per_step


@dataclass
class FidelityReport:
    summary: dict
    records: list[dict]


def evaluate(
    model: Dynamics,
    rows: Sequence[dict],
    horizon: int,
    batch_size: int = 32,
    progress: bool = False,
    setting_of: Callable[[str], str] | None = None,
) -> FidelityReport:
    """The fidelity report of `model` on the real transitions `rows`; with `setting_of` (a task
    id's setting, e.g. the game's generation settings) the scores of each setting too."""
    records = single_step(model, rows, batch_size, progress)
    n = len(records)
    if not n:
        raise ValueError("no real transitions to evaluate on")
    summary = {
        **_scores(records),
        "retried_rate": sum(r["attempts"] > 1 for r in records) / n,
        "field_f1": {name: _mean(records, f"f1_{name}") for name in FIELDS},
        "foreseeable_fraction": _mean(records, "foreseeable"),
        "foreseeable": _scores([r for r in records if r["foreseeable"]]),
        "multi_step": open_loop(model, rows, horizon, batch_size, progress) if horizon else [],
    }
    if setting_of is not None:
        summary["by_setting"] = by_setting(records, setting_of)
    return FidelityReport(summary=summary, records=records)


def by_setting(records: Sequence[dict], setting_of: Callable[[str], str]) -> dict[str, dict]:
    """The scores of each setting's records (and its number of games), settings in natural order
    (rooms 6 before rooms 12)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        groups[setting_of(record["task_id"])].append(record)
    natural = lambda label: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]  # noqa: E731
    return {
        label: {"games": len({r["task_id"] for r in groups[label]}), **_scores(groups[label])}
        for label in sorted(groups, key=natural)
    }


def setting_table(by_setting: dict[str, dict]) -> str:
    """`by_setting` as a Markdown table."""
    lines = [
        "| setting | games | transitions | next state exact | reward | done | parse failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, scores in by_setting.items():
        lines.append(
            f"| {label} | {scores['games']} | {scores['transitions']} | {scores['next_state_exact_match']:.1%} | "
            f"{scores['reward_accuracy']:.1%} | {scores['done_accuracy']:.1%} | {scores['parse_failure_rate']:.1%} |"
        )
    return "\n".join(lines)


def _mean(records: Sequence[dict], key: str) -> float:
    return sum(float(r[key]) for r in records) / len(records) if records else 0.0


def _scores(records: Sequence[dict]) -> dict:
    return {
        "transitions": len(records),
        "next_state_exact_match": _mean(records, "exact_match"),
        "reward_accuracy": _mean(records, "reward_correct"),
        "done_accuracy": _mean(records, "done_correct"),
        "parse_failure_rate": 1 - _mean(records, "parsed") if records else 0.0,
    }
