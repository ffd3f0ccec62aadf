"""Supervised examples for the experience model: one (prompt, completion) per real transition.

The prompt holds the last `history` steps of the episode and `neighbours` similar transitions
retrieved from the replay buffer as worked examples, never from the example's own trajectory
(that would show the model the answer's neighbourhood in its own episode, which a synthetic
rollout never has). Retrieval is batched: one search for a batch of rows.

`done` in a completion is the environment's `terminated` (the game was won or lost), not
`truncated`: truncation is the step budget of whoever runs the episode, which neither the state
nor the action shows, so the synthetic environment applies its own budget, as the real one does.

With `experience.placeholders`, game-specific objects are shown as placeholders (dreamgym/placeholders.py),
in the example's own rows and, numbered on their own, in each worked example. With
`experience.copy_examples`, a completion whose change is exactly a worked example's names that
example (`same as example 1`, format.py) instead of writing the change out. A model trained on
state-diff traces is shown each worked example's trace too (`traces_examples`; format.py says why),
and with `copy_examples` a reasoning that is exactly an example's trace names that example too.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from dreamgym.buffer.db import Database
from dreamgym.buffer.embeddings import Encoder, transition_text
from dreamgym.buffer.retrieval import Filters, search, stored_embeddings, stored_trajectories, task_instructions
from dreamgym.data.schema import score_before
from dreamgym.domain import NO_RULES, Domain, named_domain
from dreamgym.envs.dynamics import Query, Step
from dreamgym.experience.affordances import (
    Affordances,
    Item,
    adapted_change,
    items_of,
    learnt_from_rows,
    template_of,
)
from dreamgym.experience.annotate import Annotator, describe_change
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.format import (
    Worked,
    applied,
    format_completion,
    format_prompt,
    referenced_delta,
    referenced_trace,
    state_delta,
    task_says,
)
from dreamgym.experience.rerank import closest, situation, stored_change, stored_situation
from dreamgym.placeholders import Placeholders, kept_names, shown_names
from dreamgym.renaming import Renamer
from dreamgym.state import AbstractState, format_state, item_name, parse_state, whole_word

_KEPT_KEY = "dreamgym.kept_names"
# Candidates fetched per neighbour kept: room for repeats of one step across episodes.
_CANDIDATES_PER_NEIGHBOUR = 3


@dataclass(frozen=True)
class Example:
    """One SFT example, with where it and its worked examples come from."""

    prompt: str
    completion: str
    trajectory_id: str
    task_id: str
    step: int
    content_hash: str
    neighbour_hashes: tuple[str, ...] = ()  # content hashes of the worked examples
    neighbour_trajectory_ids: tuple[str, ...] = ()  # and their trajectories, in prompt order
    objective: str = "transition"  # or "variation": seed task -> variant task (variations.py)


def history_of(rows: Sequence[dict], index: int, h: int) -> list[Step]:
    """The up to `h` steps just before `rows[index]` in its trajectory, oldest first.

    `rows` are sorted by (trajectory_id, step). The history stops at a gap in the step numbers
    (a transition quarantined by validation): a step further back would be shown as the previous
    one, which it is not.
    """
    row, steps = rows[index], []
    for previous in reversed(rows[max(0, index - h) : index]):
        if previous["trajectory_id"] != row["trajectory_id"] or previous["step"] != row["step"] - len(steps) - 1:
            break
        steps.append(Step(previous["action"], previous["reward"], parse_state(previous["state"]).location))
    return steps[::-1]


def queries_of(rows: Sequence[dict], h: int) -> list[Query]:
    """Real transitions as experience-model queries, as their examples are built and fidelity reads
    them: each row's task, real state and action, and the up to `h` steps before it (`rows` sorted
    by (trajectory_id, step), as `history_of` needs them), with every earlier step of the episode
    back to a gap in the step numbers."""
    queries, earlier = [], []
    for index, row in enumerate(rows):
        previous = rows[index - 1] if index else None
        if previous is None or (previous["trajectory_id"], previous["step"] + 1) != (row["trajectory_id"], row["step"]):
            earlier = []
        state = parse_state(row["state"])
        queries.append(
            Query(
                row["instruction"],
                state,
                row["action"],
                tuple(history_of(rows, index, h)),
                row["trajectory_id"],
                earlier=tuple(earlier),
                score=score_before(row),
            )
        )
        earlier.append((state, row["action"]))
    return queries


def neighbours(
    database: Database | None,
    encoder: Encoder | None,
    queries: Sequence[dict],
    k: int,
    ef_search: int,
    vectors: np.ndarray | None = None,
    synthetic: bool = False,
    pool: int = 0,
    kept: frozenset[str] | None = None,
    ranking_off: Sequence[str] = (),
    domain: Domain = NO_RULES,
) -> list[list[dict]]:
    """The k most similar distinct transitions of each query, in one search for all of them, each
    with its task's `instruction`.

    A query has `instruction`, `state` (its text, as in a transition row, or an `AbstractState`,
    as in a rollout) and `action`, and optionally `trajectory_id`, whose transitions are then never
    returned. `vectors` are the queries' embeddings when known (else they are encoded). Repeats of
    one (state, action) from other episodes are kept once: a copy teaches the model nothing the
    first did not, and costs prompt length. Only real transitions are returned unless `synthetic`
    (then DreamEnv's written-back ones too). With `pool`, that many candidates are fetched and the
    k closest in situation kept (rerank.py; `kept`: the model's kept names, None without
    placeholders; `ranking_off`: ranking keys switched off; `domain`: the environment's rules);
    with 0, the k nearest by embedding.
    With k == 0 nothing is retrieved and neither the database nor the encoder is needed.
    """
    if k == 0 or not queries:
        return [[] for _ in queries]
    if database is None or (encoder is None and vectors is None):
        raise ValueError("retrieving neighbours (k > 0) needs a buffer database and an encoder")
    # Queries that ask the same get the same neighbours, found once: a GRPO group's rollouts start
    # from one state and often take the same moves. A query's own trajectory is left out of its
    # neighbours; one the search cannot return (a dream's, where only real rows are searched)
    # leaves nothing out, so it does not set its query apart.
    searchable = stored_trajectories(
        database, {q["trajectory_id"] for q in queries if q.get("trajectory_id")}, None if synthetic else "real"
    )
    keys = [
        (
            q["instruction"],
            _state_text(q["state"]),
            q["action"],
            q["trajectory_id"] if q.get("trajectory_id") in searchable else None,
        )
        for q in queries
    ]
    first: dict[tuple, int] = {}
    for index, key in enumerate(keys):
        first.setdefault(key, index)
    asked = list(first.values())
    found = _retrieved(
        database,
        encoder,
        [queries[i] | {"trajectory_id": keys[i][3]} for i in asked],
        k,
        ef_search,
        None if vectors is None else vectors[asked],
        synthetic,
        pool,
        kept,
        ranking_off,
        domain,
    )
    by_key = {keys[i]: rows for i, rows in zip(asked, found)}
    # Each query its own dicts, as `_retrieved` makes them (callers may add to what they get): a
    # repeated query gets copies.
    return [
        by_key[key] if first[key] == index else [dict(row) for row in by_key[key]] for index, key in enumerate(keys)
    ]


def _retrieved(
    database: Database,
    encoder: Encoder | None,
    queries: Sequence[dict],
    k: int,
    ef_search: int,
    vectors: np.ndarray | None,
    synthetic: bool,
    pool: int,
    kept: frozenset[str] | None,
    ranking_off: Sequence[str],
    domain: Domain,
) -> list[list[dict]]:
    """`neighbours` of distinct queries: one search for all of them, then the ranking."""
    if vectors is None:  # the encoder encodes each distinct text once and keeps it
        vectors = encoder.encode(
            [transition_text(q["instruction"], _state_text(q["state"]), q["action"]) for q in queries]
        )
    filters = [
        Filters(
            source=None if synthetic else "real",
            exclude_trajectory_ids=(q["trajectory_id"],) if q.get("trajectory_id") else (),
        )
        for q in queries
    ]
    fetched = max(pool, k * _CANDIDATES_PER_NEIGHBOUR)
    # Without a filter pgvector returns at most ef_search rows; with one it scans on (retrieval.py).
    found = search(database, vectors, fetched, filters=filters, ef_search=max(ef_search, fetched))
    candidates = [_distinct([hit.transition for hit in hits]) for hits in found]
    # The tasks' words (format.task_says), which the ranking reads too. The candidates of a batch
    # come from a few hundred tasks: one small query.
    tasks = task_instructions(database, {t["task_id"] for ts in candidates for t in ts})
    off = frozenset(ranking_off)
    chosen = (
        [transitions[:k] for transitions in candidates]
        if not pool
        else [
            _closest(query, transitions, k, kept, tasks, off, domain) for query, transitions in zip(queries, candidates)
        ]
    )
    return [[row | {"instruction": tasks.get(row["task_id"])} for row in rows] for rows in chosen]


def _closest(
    query: dict,
    transitions: list[dict],
    k: int,
    kept: frozenset[str] | None,
    tasks: dict[str, str],
    off: frozenset[str],
    domain: Domain,
) -> list[dict]:
    state = query["state"] if isinstance(query["state"], AbstractState) else parse_state(query["state"])
    chosen = closest(
        situation(state, query["action"], kept, query["instruction"], domain, _score_before(query)),
        [
            stored_situation(t["state"], t["action"], kept, tasks.get(t["task_id"]), domain, _score_before(t))
            for t in transitions
        ],
        k,
        [stored_change(t["state"], t["next_state"], t["action"], kept) for t in transitions],
        off,
    )
    return [transitions[index] for index in chosen]


def _score_before(row: dict) -> float | None:
    """The game's score before the step of a query (its `score_before`, None where unknown) or of a
    transition row (`score_before`)."""
    if "score_before" in row:
        return row["score_before"]
    return score_before(row) if row.get("score") is not None else None


def _distinct(transitions: list[dict]) -> list[dict]:
    kept, seen = [], set()
    for transition in transitions:
        key = (transition["state"], transition["action"])
        if key not in seen:
            seen.add(key)
            kept.append(transition)
    return kept


def _state_text(state: str | AbstractState) -> str:
    return state if isinstance(state, str) else format_state(state)


def to_worked(transition: dict, traced: bool = False) -> Worked:
    """A retrieved transition (retrieval.RETURNED_COLUMNS, with its task's `instruction`) as a
    worked example; `traced`: with its state-diff reasoning trace (`describe_change`)."""
    state, next_state = parse_state(transition["state"]), parse_state(transition["next_state"])
    said = task_says(transition["instruction"], state, transition["action"]) if transition.get("instruction") else None
    reasoning = (
        describe_change(
            state,
            transition["action"],
            next_state,
            transition["reward"],
            transition["terminated"],
            transition.get("won"),
            task=transition.get("instruction"),
        )
        if traced
        else None
    )
    return Worked(
        location=state.location,
        action=transition["action"],
        delta=state_delta(state, next_state),
        reward=transition["reward"],
        done=transition["terminated"],
        task_says=said,
        reasoning=reasoning,
    )


def adapted_examples(
    found: Sequence[dict],
    state: AbstractState,
    action: str,
    names: Placeholders,
    affordances: Affordances,
    traced: bool,
    instruction: str | None = None,
    domain: Domain = NO_RULES,
) -> list[Worked]:
    """The retrieved transitions `found` as worked examples (`to_worked`) for taking `action` in
    `state` for the task `instruction`: each on the query's items where it is the same move
    (`on_the_query_items`), using up the query's task items where it uses up its own
    (`on_the_task_items`, by `domain`'s task objects), its change as it makes in `state` for that
    task (affordances.adapted_change)."""
    found = [on_the_query_items(transition, action, state) for transition in found]
    task_objects = domain.task_objects(instruction) if instruction else ()
    adapted = []
    for worked, transition in zip((to_worked(t, traced) for t in found), found):
        made_in = parse_state(transition["state"])
        change = worked.delta
        if transition["action"] == action:
            change = on_the_task_items(
                change, made_in, transition.get("instruction"), state, instruction, action, domain
            )
        adapted.append(
            dataclasses.replace(worked, delta=adapted_change(state, change, names, affordances, made_in, task_objects))
        )
    return adapted


def on_the_task_items(
    change: str,
    made_in: AbstractState,
    their_task: str | None,
    state: AbstractState,
    our_task: str | None,
    action: str,
    domain: Domain,
) -> str:
    """`change`, which `action` made in `made_in` for `their_task`, told of the query's items
    where it uses up exactly the carried items its task asks for, and `action` names none of them
    (`prepare meal` takes the recipe's ingredients from the inventory): it then uses up the items
    carried in `state` that `our_task` asks for (`domain.task_objects`), and adds what it adds
    (`meal`). An action that names what it uses up (`eat carrot`) is told of the query's items by
    `on_the_query_items`. Shown as it was, an example of a two-ingredient recipe removed the
    query's items of its own placeholder numbers, whatever the query's recipe asked, and nearly
    every `prepare meal` of three-ingredient recipes was wrong (measured: results log, 2026-11-29)."""
    after = applied(made_in, change) if their_task and our_task else None
    if after is None:
        return change
    carried = {item_name(item) for item in made_in.inventory}
    used_up = carried - {item_name(item) for item in after.inventory}
    if not used_up or used_up != carried & set(domain.task_objects(their_task)):
        return change
    if any(whole_word(name).search(action) for name in used_up):
        return change
    ours = set(domain.task_objects(our_task))
    kept = {item for item in state.inventory if item_name(item) not in ours}
    gained = set(after.inventory) - set(made_in.inventory)
    if len(kept) == len(state.inventory) or gained & kept:  # nothing of ours to use up; or it has what is gained
        return change
    line = state_delta(state, dataclasses.replace(state, inventory=tuple(sorted(kept | gained))))
    lines = [line if old.startswith(("inventory:", "inventory =")) else old for old in change.split("\n")]
    return "\n".join(lines)


def on_the_query_items(transition: dict, action: str, state: AbstractState) -> dict:
    """`transition` told of the query's items, where its action is the same move as `action`
    (rerank's `action_form`: `open frosted-glass door` for `open screen door`); else as it is.

    Each item its action names is swapped, throughout, with the one `action` names in `state`,
    and so is the one descriptor in which two such items differ (`north` and `east` of two doors:
    `+go north` becomes `+go east`), unless it is a word actions begin with (`open`): a swap, not
    a one-way rename, so that an example whose state also holds the query's item stays a world of
    distinct objects. Shown as it was, the example's change is about its own item, which the
    query's state may hold too: the model named it and opened the wrong door."""
    made_in = parse_state(transition["state"])
    ours_form, ours = template_of(action, shown_names(state))
    theirs_form, theirs = template_of(transition["action"], shown_names(made_in))
    if ours_form != theirs_form:
        return transition
    verbs = {words.split()[0] for words in (*made_in.actions, *state.actions) if words}
    their_items, our_items = items_of(made_in), items_of(state)
    swap: dict[str, str] = {}
    for their, our in zip(theirs, ours):
        told_apart = _one_difference(_states(their_items, their), _states(our_items, our))
        for old, new in [(their, our), *([told_apart] if told_apart and not verbs & set(told_apart) else [])]:
            if old == new:
                continue
            if swap.get(old, new) != new or swap.get(new, old) != old:
                return transition  # one item in two slots on one side only: no consistent swap
            swap[old], swap[new] = new, old
    return Renamer(swap).row(transition) if swap else transition


def _states(items: dict[str, Item], name: str) -> set[str]:
    """The descriptors of the item called `name` other than where it lies (none if no item is)."""
    return set(items[name].states) if name in items else set()


def _one_difference(theirs: set[str], ours: set[str]) -> tuple[str, str] | None:
    """The descriptor only theirs has and the one only ours has, where each has one."""
    only_theirs, only_ours = theirs - ours, ours - theirs
    if len(only_theirs) == 1 and len(only_ours) == 1:
        return next(iter(only_theirs)), next(iter(only_ours))
    return None


def traces_examples(config: ExperienceConfig) -> bool:
    """Whether worked examples show their reasoning: a model trained on state-diff traces (whose
    traces also state the reward and the end, which decoding holds to: constrain.py)."""
    return config.reasoning and config.annotator == "state-diff"


def build_examples(
    database: Database | None,
    encoder: Encoder | None,
    rows: Sequence[dict],
    config: ExperienceConfig,
    ef_search: int,
    annotate: Annotator = describe_change,
    batch: int = 256,
    progress: bool = False,
    kept: frozenset[str] | None = None,
    affordances: Affordances | None = None,
) -> list[Example]:
    """One example per transition row (`dreamgym.data.schema` columns), sorted by trajectory and
    step; retrieval runs once per
    `batch` rows. With `config.placeholders`, objects not in `kept` (default: `kept_names(rows)`)
    are shown as placeholders (dreamgym/placeholders.py). With `config.learnt_actions`, the worked
    examples' changes are adapted to each query's state with `affordances` (affordances.py;
    default: learnt from `rows`)."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    ordered = sorted(rows, key=lambda row: (row["trajectory_id"], row["step"]))
    if config.placeholders and kept is None:
        kept = kept_names(ordered)
    elif not config.placeholders:
        kept = None
    domain = named_domain(config.domain)
    if config.adapts_examples and affordances is None:  # learnt from the rows the examples are built of
        affordances = learnt_from_rows(ordered, kept, domain)
    examples: list[Example] = []
    with tqdm(total=len(ordered), desc="SFT examples", unit="row", disable=not progress) as bar:
        for start in range(0, len(ordered), batch):
            chunk = ordered[start : start + batch]
            found = neighbours(
                database,
                encoder,
                chunk,
                config.neighbours,
                ef_search,
                _known_vectors(database, encoder, chunk) if config.neighbours else None,
                synthetic=config.synthetic_neighbours,
                pool=config.retrieval_pool,
                kept=kept,
                ranking_off=config.ranking_off,
                domain=domain,
            )
            for offset, transitions in enumerate(found):
                examples.append(
                    _example(ordered, start + offset, transitions, config, annotate, domain, kept, affordances)
                )
            bar.update(len(found))
    return examples


def _example(
    rows: Sequence[dict],
    index: int,
    found: list[dict],
    config: ExperienceConfig,
    annotate: Annotator,
    domain: Domain,
    kept: frozenset[str] | None = None,
    affordances: Affordances | None = None,
) -> Example:
    names = Placeholders({})
    if kept is not None:  # the prompt's and each worked example's own placeholders
        names = Placeholders.of_row(kept, rows[index])
        rows = [names.row(row) for row in rows[max(0, index - config.history) : index + 1]]
        index = len(rows) - 1
        found = [Placeholders.own(kept, transition) for transition in found]
    row = rows[index]
    state, next_state = parse_state(row["state"]), parse_state(row["next_state"])
    done = row["terminated"]
    reasoning = (
        annotate(state, row["action"], next_state, row["reward"], done, row["won"], task=row["instruction"])
        if config.reasoning
        else None
    )
    worked = (
        adapted_examples(
            found,
            state,
            row["action"],
            names,
            affordances,
            traces_examples(config),
            row["instruction"],
            domain,
        )
        if config.adapts_examples
        else [to_worked(t, traces_examples(config)) for t in found]
    )
    prompt = format_prompt(row["instruction"], history_of(rows, index, config.history), state, row["action"], worked)
    delta = (
        referenced_delta(state, next_state, [example.delta for example in worked])
        if config.copy_examples
        else state_delta(state, next_state)
    )
    if config.copy_examples and reasoning is not None:
        reasoning = referenced_trace(reasoning, [example.reasoning for example in worked])
    return Example(
        prompt=prompt,
        completion=format_completion(reasoning, delta, row["reward"], done),
        trajectory_id=row["trajectory_id"],
        task_id=row["task_id"],
        step=row["step"],
        content_hash=row["content_hash"],
        neighbour_hashes=tuple(t["content_hash"] for t in found),
        neighbour_trajectory_ids=tuple(t["trajectory_id"] for t in found),
    )


def _known_vectors(database: Database, encoder: Encoder | None, rows: Sequence[dict]) -> np.ndarray:
    """The rows' embeddings, read from the buffer where stored (encoding is the slow part)."""
    stored = stored_embeddings(database, [row["content_hash"] for row in rows])
    missing = [row for row in rows if row["content_hash"] not in stored]
    if missing:
        if encoder is None:
            raise ValueError("rows not in the buffer need an encoder to be embedded")
        encoded = encoder.encode([transition_text(r["instruction"], r["state"], r["action"]) for r in missing])
        stored |= {row["content_hash"]: vector for row, vector in zip(missing, encoded)}
    return np.stack([stored[row["content_hash"]] for row in rows])


def save_examples(examples: Sequence[Example], path: str | Path, kept: frozenset[str] | None = None) -> Path:
    """Write examples to Parquet, atomically (a crash never leaves a partial file to be reused),
    with the kept names of their placeholders (None: no placeholders) in the file's metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {field.name: [getattr(e, field.name) for e in examples] for field in fields(Example)}
    columns = {
        name: [list(v) for v in values] if name.startswith("neighbour_") else values for name, values in columns.items()
    }
    table = pa.table(columns)
    if kept is not None:
        table = table.replace_schema_metadata({_KEPT_KEY: json.dumps(sorted(kept))})
    partial = path.with_suffix(".partial")
    pq.write_table(table, partial)
    partial.replace(path)
    return path


def load_kept_names(path: str | Path) -> frozenset[str] | None:
    """The kept names the examples in `path` were built with; None if they have no placeholders."""
    kept = (pq.read_schema(path).metadata or {}).get(_KEPT_KEY.encode())
    return None if kept is None else frozenset(json.loads(kept))


def load_examples(path: str | Path) -> list[Example]:
    return [
        Example(**{name: tuple(value) if name.startswith("neighbour_") else value for name, value in row.items()})
        for row in pq.read_table(path).to_pylist()
    ]
