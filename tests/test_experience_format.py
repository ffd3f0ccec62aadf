"""The experience model's text format, reasoning annotators and SFT examples, on real collected
TextWorld transitions, a real Postgres buffer, the real encoder and a real local HTTP server."""

from __future__ import annotations

import json
import random
import re
import threading
from collections import defaultdict
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import numpy as np
import pytest

from dreamgym.buffer.embeddings import transition_text
from dreamgym.buffer.store import upsert_transitions
from dreamgym.data.collect import CollectionSettings, collect
from dreamgym.data.schema import MISTAKE_POLICY, read_transitions
from dreamgym.envs.textworld.cooking import TextWorldCooking
from dreamgym.experience.annotate import (
    AnnotatorError,
    OpenAIAnnotator,
    describe_change,
    make_annotator,
    stated_change,
    stated_outcome,
)
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.constrain import completion_pattern
from dreamgym.experience.decoding import copied_completion
from dreamgym.experience.examples import build_examples, history_of, neighbours, to_worked, traces_examples
from dreamgym.experience.format import (
    FormatError,
    Worked,
    applied,
    apply_delta,
    example_changes,
    example_outcomes,
    example_traces,
    format_completion,
    format_prompt,
    parse_completion,
    referenced_delta,
    referenced_trace,
    state_delta,
    task_says,
)
from dreamgym.experience.rerank import closeness, situation, stored_change, stored_situation
from dreamgym.placeholders import Placeholders, kept_names
from dreamgym.renaming import Renamer, invented_names
from dreamgym.state import AbstractState, acted_object, format_state, item_name, parse_state

STATE = AbstractState(
    "kitchen", ("fridge (closed)", "knife (on table)", "table"), (), ("open fridge", "take knife from table")
)
OPENED = AbstractState(
    "kitchen",
    ("fridge (open)", "knife (on table)", "milk (in fridge)", "table"),
    (),
    ("close fridge", "take knife from table", "take milk from fridge"),
)
GOOD = format_completion("The fridge is now open.", state_delta(STATE, OPENED), 0, False)


@pytest.fixture(scope="module")
def rows(offline_dataset) -> list[dict]:
    """The dataset's transitions, sorted as examples are built: by trajectory, then step."""
    return sorted(read_transitions(offline_dataset).to_pylist(), key=lambda row: (row["trajectory_id"], row["step"]))


@pytest.fixture(scope="module")
def vectors(rows, encoder) -> np.ndarray:
    return encoder.encode([transition_text(r["instruction"], r["state"], r["action"]) for r in rows])


@pytest.fixture
def filled(buffer_db, offline_dataset, rows, vectors):
    table = read_transitions(offline_dataset).sort_by([("trajectory_id", "ascending"), ("step", "ascending")])
    upsert_transitions(buffer_db, table, embeddings=vectors)
    return buffer_db


def states(row: dict) -> tuple[AbstractState, AbstractState]:
    return parse_state(row["state"]), parse_state(row["next_state"])


# --- delta and completion round trip -----------------------------------------------------------


def test_state_delta_writes_an_edit_that_reads_back():
    assert state_delta(STATE, STATE) == "no change"
    assert apply_delta(STATE, "no change") == STATE
    assert state_delta(STATE, OPENED) == (
        "visible: -fridge; +fridge (open); +milk (in fridge)\n"  # a removal names the item
        "actions: -open fridge; +close fridge; +take milk from fridge"
    )
    assert apply_delta(STATE, state_delta(STATE, OPENED)) == OPENED
    # In the same place a list is edited, even where replacing it would be shorter ...
    carrying = AbstractState("hall", (), ("a long thing", "another long thing"), ())
    assert state_delta(carrying, AbstractState("hall")) == "inventory: -a long thing; -another long thing"
    assert apply_delta(carrying, "inventory =") == AbstractState("hall")
    # ... and on a move it takes the shorter form; a tie ("visible: +ab" / "visible = ab") goes to the diff.
    assert state_delta(carrying, AbstractState("yard")) == "location: yard\ninventory ="
    assert state_delta(AbstractState("hall"), AbstractState("yard", ("ab",))) == "location: yard\nvisible: +ab"
    moved = AbstractState("garden", STATE.visible, (), STATE.actions)
    assert state_delta(STATE, moved) == "location: garden"


def test_a_removal_by_name_carries_over_to_an_item_in_another_condition():
    """The edit a worked example shows means the same in a state where the item was cut, cooked
    or placed otherwise: what the removal names is the item, not its descriptors."""
    took = AbstractState(
        "kitchen", ("fridge (closed)", "table"), ("knife",), ("drop knife", "open fridge", "put knife on table")
    )
    change = state_delta(STATE, took)
    assert change == (
        "visible: -knife\ninventory: +knife\nactions: -take knife from table; +drop knife; +put knife on table"
    )
    elsewhere = AbstractState(
        "kitchen", ("fridge (closed)", "knife (on counter)", "table"), (), ("open fridge", "take knife from table")
    )
    assert apply_delta(elsewhere, change) == took
    # Two items of one name: the writer names the one it removes in full; a bare name is ambiguous.
    twins = AbstractState("hall", ("coin (gold)", "coin (silver)"))
    assert state_delta(twins, AbstractState("hall", ("coin (silver)",))) == "visible: -coin (gold)"
    with pytest.raises(FormatError, match="2 items have that name; write the item in full"):
        apply_delta(twins, "visible: -coin")


@pytest.mark.parametrize("with_reasoning", [True, False], ids=["reasoning", "no-reasoning"])
def test_every_real_transition_round_trips_through_prompt_and_parser(rows, with_reasoning):
    config = ExperienceConfig(neighbours=0, reasoning=with_reasoning, placeholders=False)
    examples = build_examples(None, None, rows, config, ef_search=100)
    assert [e.content_hash for e in examples] == [r["content_hash"] for r in rows]
    for example, row in zip(examples, rows):
        state, next_state = states(row)
        said = task_says(row["instruction"], state, row["action"])
        assert example.prompt.endswith(
            f"<state>\n{row['state']}\n</state>\n"
            f"<action>{row['action']}</action>\n" + ("" if said is None else f"<task_says>{said}</task_says>\n")
        )
        assert "<examples>" not in example.prompt
        parsed = parse_completion(example.completion, state, reasoning=with_reasoning)
        assert parsed.next_state == next_state
        assert format_state(parsed.next_state) == row["next_state"]
        assert (parsed.reward, parsed.done) == (row["reward"], row["terminated"])
        assert (parsed.reasoning is not None) == with_reasoning
        assert completion_pattern(with_reasoning).fullmatch(example.completion), example.completion
    # Deltas are what make completions short: far shorter than the next state in full.
    deltas = [len(state_delta(*states(row))) for row in rows]
    assert np.median(deltas) < np.median([len(row["next_state"]) for row in rows]) / 2


def _prompt_state(prompt: str) -> AbstractState:
    return parse_state(prompt.split("<state>\n")[1].split("\n</state>")[0])


def test_renaming_is_simultaneous_and_whole_word_and_states_stay_sorted():
    renamer = Renamer({"red apple": "zu", "apple": "red apple", "knife": "a knife"})
    assert (
        renamer.text("take red apple; eat apple; knifes; pineapple; frosted-knife")
        == "take zu; eat red apple; knifes; pineapple; frosted-knife"
    )
    state = AbstractState(
        "kitchen", ("apple (on table)", "red apple", "table"), ("knife",), ("eat apple", "take apple from table")
    )
    renamed = parse_state(renamer.state(format_state(state)))
    assert renamed == AbstractState(
        "kitchen", ("red apple (on table)", "table", "zu"), ("a knife",), ("eat red apple", "take red apple from table")
    )
    names = ["red apple", "knife", "cookbook"]
    mapping = invented_names(names, random.Random(7), ["red", "apple"])
    assert mapping == invented_names(names, random.Random(7), ["red", "apple"])
    assert len(set(mapping.values())) == 3 and not set(mapping.values()) & set(names)
    made_up = [
        word
        for name in invented_names([str(n) for n in range(300)], random.Random(1), []).values()
        for word in name.split()
    ]
    assert min(len(word) for word in made_up) >= 4  # never 'on', 'in', 'to': command words


def test_history_is_the_previous_steps_of_the_same_trajectory(rows):
    starts = [i for i, row in enumerate(rows) if row["step"] == 0]
    assert history_of(rows, starts[1], 3) == []  # the previous row belongs to another trajectory
    later = next(i for i, row in enumerate(rows) if row["step"] == 4)
    history = history_of(rows, later, 3)
    assert [step.action for step in history] == [rows[later - n]["action"] for n in (3, 2, 1)]
    assert history[-1].location == parse_state(rows[later - 1]["state"]).location
    prompt = format_prompt("cook", history, parse_state(rows[later]["state"]), rows[later]["action"], [])
    assert f"\n{history[0].location}: {history[0].action} -> {history[0].reward:g}\n" in prompt


@pytest.mark.parametrize(
    "delta, problem",
    [
        ("", "empty delta"),
        ("score: +1", "unknown field 'score'"),
        ("visible: -table\nvisible: +chair", "'visible' is repeated"),
        ("visible: -milk (in fridge)", "cannot remove 'milk \\(in fridge\\)' from visible: it is not there"),
        ("visible: -milk", "cannot remove 'milk' from visible: it is not there"),
        ("visible: -knife (on counter)", "cannot remove 'knife \\(on counter\\)' from visible"),
        ("visible: +table", "cannot add 'table' to visible: it is already there"),
        ("location = hall", "location is written 'location: <new location>'"),
        ("visible +chair", "malformed delta line"),
        ("visible: chair", "must be '-item' or '\\+item'"),
        ("visible: -table; +table", "'table' is both removed and added"),
        ("no change\nvisible: +chair", "'no change' must be the whole delta"),
        ("visible: +a;b", "the delta gives an invalid state"),
        ("visible: +chair; +chair", "visible additions repeat an item"),
        ("visible = table; table", "repeat an item"),
        # Items no game shows, which a dream kept and acted on (state.py): refused as invalid states.
        ("visible: +examine fridge)", "the delta gives an invalid state"),
        ("visible: +obj2 (on counter) to the inventory", "the delta gives an invalid state"),
        ("visible = +obj1 (closed); table", "the delta gives an invalid state"),
    ],
)
def test_apply_delta_names_what_is_wrong(delta, problem):
    with pytest.raises(FormatError, match=problem):
        apply_delta(STATE, delta)


def test_the_decoding_format_admits_no_item_a_state_refuses():
    """The constrained decoding holds a completion to `completion_pattern`, whose items are the
    state's (state.ITEM_PATTERN): the model cannot start writing what the parser would refuse."""
    pattern = completion_pattern(reasoning=False)
    added = "<next_state>\nvisible: +"
    assert pattern.fullmatch(added + "obj1 (closed); +frosted-glass door (open)", partial=True)
    for malformed in ("examine fridge)", "obj2 (on counter) to", "+examine", "(open)"):
        assert not pattern.fullmatch(added + malformed, partial=True), malformed
    assert not pattern.fullmatch("<next_state>\nvisible = fridge (open); +obj1", partial=True)


@pytest.mark.parametrize(
    "delta, meaning",
    [
        ("actions: +look\nvisible: -table", "visible: -table\nactions: +look"),
        ("location: kitchen", "no change"),
        ("visible: +chair; -table", "visible: -table; +chair"),
        ("visible: +zebra; +apple", "visible: +apple; +zebra"),
        ("visible = table; fridge (closed)", "visible: -knife (on table)"),
        ("visible: -knife", "visible: -knife (on table)"),
        ("visible = fridge (closed); knife (on table); table", "no change"),
    ],
)
def test_apply_delta_reads_lists_as_sets_whatever_their_order(delta, meaning):
    """Order is presentation: another order, or restating a current value, means the same."""
    assert apply_delta(STATE, delta) == apply_delta(STATE, meaning)


def _without_reasoning(text: str) -> str:
    return text.split("</reasoning>\n", 1)[1]


@pytest.mark.parametrize(
    "text, reasoning, problem",
    [
        (GOOD.replace("<reward>0</reward>\n", ""), True, "missing <reward> section"),
        (_without_reasoning(GOOD), True, "missing <reasoning> section"),
        (GOOD, False, "unexpected <reasoning> section"),
        (GOOD.replace("<done>", "<reward>1</reward>\n<done>"), True, "duplicated <reward> section"),
        (
            GOOD.replace("<reward>0</reward>\n<done>false</done>", "<done>false</done>\n<reward>0</reward>"),
            True,
            "sections out of order",
        ),
        (GOOD.replace("</reward>", ""), True, "<reward> is not closed"),
        (
            GOOD.replace("</next_state>\n<reward>0</reward>", "<reward>0</reward>\n</next_state>"),
            True,
            "sections overlap",
        ),
        (GOOD.replace("<reward>0<", "<reward>zero<"), True, "unparsable reward 'zero'"),
        (GOOD.replace("<reward>0<", "<reward>nan<"), True, "unparsable reward 'nan'"),
        (GOOD.replace("<reward>0<", "<reward>1e999<"), True, "reward '1e999' is not a finite number"),
        (GOOD.replace("<done>false<", "<done>False<"), True, "done must be exactly 'true' or 'false'"),
        (GOOD + "\n<|endoftext|>", True, "trailing text after </done>"),
        (GOOD.replace("\n<reward>", "\nso:\n<reward>"), True, "unexpected text between </next_state> and <reward>"),
        ("Sure!\n" + GOOD, True, "unexpected text before <reasoning>"),
        (GOOD.replace("The fridge is now open.", " "), True, "empty <reasoning> section"),
        (GOOD.replace("-fridge;", "-fridges;"), True, "cannot remove 'fridges' from visible"),
    ],
)
def test_parse_completion_names_what_is_wrong(text, reasoning, problem):
    with pytest.raises(FormatError, match=problem):
        parse_completion(text, STATE, reasoning=reasoning)


def test_surrounding_whitespace_is_tolerated_and_what_would_not_read_back_is_refused():
    parsed = parse_completion(f"\n  {GOOD}\n\n", STATE, reasoning=True)
    assert parsed.next_state == OPENED and parsed.reasoning == "The fridge is now open."
    assert parse_completion(format_completion(None, "no change", -0.5, True), STATE, False).reward == -0.5
    with pytest.raises(FormatError, match="section tags"):
        format_completion("see <done>", "no change", 0, False)
    with pytest.raises(FormatError, match="not a finite number"):
        format_completion(None, "no change", float("inf"), False)


def test_a_completion_can_name_the_worked_example_whose_change_is_the_answer():
    took = AbstractState(
        "kitchen", ("fridge (closed)", "table"), ("knife",), ("drop knife", "open fridge", "put knife on table")
    )
    worked = [
        Worked("hall", "take knife from table", state_delta(STATE, took), 0, False),
        Worked("kitchen", "open fridge", state_delta(STATE, OPENED), 0, False),
    ]
    worked[1] = replace(worked[1], task_says="of fridge: Open the fridge")
    prompt = format_prompt("Cook.", [], STATE, "open fridge", worked)
    assert "action: open fridge\ntask says: of fridge: Open the fridge\nchanges:\n" in prompt
    changes = example_changes(prompt)
    assert changes == [example.delta for example in worked]  # read back from the prompt itself
    assert referenced_delta(STATE, OPENED, changes) == "same as example 2"
    assert referenced_delta(STATE, STATE, [*changes, "no change"]) == "no change"  # shorter as it is
    other = AbstractState("kitchen", STATE.visible, ("milk",), STATE.actions)
    assert referenced_delta(STATE, other, changes) == state_delta(STATE, other)
    # What a change does here counts, not its text: a removal written in full is the same step.
    in_full = changes[1].replace("-fridge;", "-fridge (closed);")
    assert referenced_delta(STATE, OPENED, [changes[0], in_full]) == "same as example 2"

    pointing = format_completion("The fridge is now open.", "same as example 2", 0, False)
    assert parse_completion(pointing, STATE, True, changes).next_state == OPENED
    assert parse_completion(GOOD, STATE, True, changes).next_state == OPENED  # written out: the same
    with pytest.raises(FormatError, match=r"names an example the prompt does not have .it shows examples 1 to 2"):
        parse_completion(pointing.replace("example 2", "example 3"), STATE, True, changes)
    with pytest.raises(FormatError, match="it shows no worked examples"):
        parse_completion(pointing, STATE, True)
    # An example's change that does not fit the state is refused, saying which example it was.
    # (Here the fridge it names is the open one, which the change both removes and adds.)
    with pytest.raises(
        FormatError,
        match=r"'same as example 2' does not fit this state: visible: 'fridge .open.' is both removed and added",
    ):
        parse_completion(pointing, OPENED, True, changes)


def test_a_reasoning_can_name_the_worked_example_whose_trace_it_is():
    opened = "Effects: fridge is now open. The score does not change."
    worked = [
        Worked(
            "kitchen",
            "open fridge",
            state_delta(STATE, OPENED),
            0,
            False,
            reasoning="Effects: fridge is now open.\n  The score does not change.",
        )
    ]
    prompt = format_prompt("Cook.", [], STATE, "open fridge", [*worked, replace(worked[0], reasoning=None)])
    traces = example_traces(prompt)
    assert traces == [opened, None]  # read back from the prompt, as shown: on one line
    assert referenced_trace(opened, traces) == "same as example 1"
    assert referenced_trace("The fridge opens.", traces) == "The fridge opens."  # written out

    naming = format_completion("same as example 1", "same as example 1", 0, False)
    parsed = parse_completion(naming, STATE, True, example_changes(prompt), traces)
    assert parsed.reasoning == opened and parsed.next_state == OPENED
    with pytest.raises(FormatError, match="'same as example 2' names example 2, which shows no reasoning"):
        parse_completion(
            naming.replace("<reasoning>same as example 1", "<reasoning>same as example 2"),
            STATE,
            True,
            example_changes(prompt),
            traces,
        )
    with pytest.raises(FormatError, match="it shows no worked examples"):
        parse_completion(naming, STATE, True)


# --- SFT examples with retrieval ---------------------------------------------------------------


def test_a_worked_example_shows_its_trace_and_its_changes_still_read_back():
    """With state-diff reasoning a worked example shows the trace the model would write for it,
    computed from its own states and task; `same as example i` still reads its changes back."""
    task = "Recipe: ingredients: milk. directions: prepare meal."
    transition = {
        "state": format_state(STATE),
        "next_state": format_state(OPENED),
        "action": "open fridge",
        "reward": 0.0,
        "terminated": False,
        "won": False,
        "instruction": task,
    }
    worked = to_worked(transition, traced=True)
    assert worked.reasoning == describe_change(STATE, "open fridge", OPENED, 0, False, False, task=task)
    assert to_worked(transition).reasoning is None
    prompt = format_prompt("Cook.", [], STATE, "open fridge", [worked])
    assert (
        f"task says: nothing of fridge\nreasoning: {worked.reasoning}\nchanges:\n{worked.delta}\n"
        "reward: 0 done: false\n</example>"
    ) in prompt
    assert example_changes(prompt) == [worked.delta]
    assert traces_examples(ExperienceConfig())
    assert not traces_examples(ExperienceConfig(reasoning=False))
    assert not traces_examples(ExperienceConfig(annotator="openai", annotator_url="http://x/v1", annotator_model="m"))


def test_worked_examples_never_come_from_the_own_trajectory(filled, encoder, rows):
    config = ExperienceConfig(placeholders=False)  # h=3, k=3, reasoning on
    examples = build_examples(filled, encoder, rows, config, ef_search=100, batch=64)
    by_hash = {row["content_hash"]: row for row in rows}
    for example in examples:
        assert len(example.neighbour_hashes) == config.neighbours
        assert example.trajectory_id not in example.neighbour_trajectory_ids
        assert all(by_hash[h]["trajectory_id"] != example.trajectory_id for h in example.neighbour_hashes)
        shown = [line.removeprefix("action: ") for line in example.prompt.split("\n") if line.startswith("action: ")]
        real = [by_hash[h]["action"] for h in example.neighbour_hashes]
        # An example of the same move on other items is shown on the query's (on_the_query_items).
        action = example.prompt.split("<action>")[1].split("</action>")[0]
        assert all(one in (row, action) for one, row in zip(shown, real, strict=True))
    assert all(e.prompt.count("<example>") == config.neighbours for e in examples)


def test_completions_name_a_worked_example_exactly_when_it_shows_the_answer(filled, encoder, rows):
    config = ExperienceConfig(placeholders=False, neighbours=2)
    examples = build_examples(filled, encoder, rows, config, ef_search=100, batch=64)
    plain = build_examples(filled, encoder, rows, replace(config, copy_examples=False), ef_search=100, batch=64)
    pointing = tracing = 0
    for example, written, row in zip(examples, plain, rows, strict=True):
        assert example.prompt == written.prompt
        state, next_state = states(row)
        changes, traces = example_changes(example.prompt), example_traces(example.prompt)
        assert len(changes) == len(traces) == 2
        # An example is named when its change, applied here, gives the next state (its text may differ).
        giving = [number for number, change in enumerate(changes, start=1) if applied(state, change) == next_state]
        if state != next_state and giving:
            pointing += 1
            assert f"<next_state>\nsame as example {giving[0]}\n" in example.completion
        else:
            assert "<next_state>\nsame as" not in example.completion
        # The reasoning names the first example whose trace it is.
        trace = parse_completion(written.completion, state, True).reasoning
        if trace in traces:
            tracing += 1
            assert f"<reasoning>same as example {traces.index(trace) + 1}</reasoning>" in example.completion
        elif not (state != next_state and giving):
            assert example.completion == written.completion
        parsed = parse_completion(example.completion, state, True, changes, traces)
        assert parsed.next_state == next_state and parsed.reward == row["reward"]
        # What decoding keeps a completion a prefix of (constrain.py) admits every one it learns.
        assert completion_pattern(True).fullmatch(example.completion), example.completion
        assert completion_pattern(True).fullmatch(written.completion), written.completion
        assert parsed.reasoning == trace
    assert pointing > len(rows) / 4, pointing  # repeated steps across episodes show their answer
    assert tracing > pointing, (tracing, pointing)  # a trace carries further than a change


def test_with_learnt_actions_an_example_is_shown_as_the_change_it_makes_and_named_where_that_is_the_answer(
    filled, encoder, rows
):
    from dreamgym.placeholders import Placeholders, kept_names

    kept = kept_names(rows)
    config = ExperienceConfig(neighbours=2)  # placeholders and learnt actions on, as by default
    plain = build_examples(
        filled, encoder, rows, replace(config, learnt_actions=False), ef_search=100, batch=64, kept=kept
    )
    # The actions are learnt from the rows the examples are built of.
    learnt = build_examples(filled, encoder, rows, config, ef_search=100, batch=64, kept=kept)
    adapted = newly_named = 0
    for before, after, row in zip(plain, learnt, rows, strict=True):
        names = Placeholders.of_row(kept, row)
        state, next_state = (names.forward.abstract(each) for each in states(row))
        shown, raw = example_changes(after.prompt), example_changes(before.prompt)
        for change, original in zip(shown, raw, strict=True):
            if change != original:  # shown as the change it makes here: it applies
                adapted += 1
                assert applied(state, change) is not None
        parsed = parse_completion(after.completion, state, True, shown, example_traces(after.prompt))
        assert parsed.next_state == next_state
        newly_named += "<next_state>\nsame as" in after.completion and "<next_state>\nsame as" not in before.completion
    assert adapted and newly_named, (adapted, newly_named)


def test_the_copy_of_the_first_example_is_the_completion_learned_where_that_example_is_the_answer(
    filled, encoder, rows
):
    # The draft that generation checks first (generate.verified_drafts) must be the text the model
    # learned to write when it copies, or the check would never hold.
    examples = build_examples(filled, encoder, rows, ExperienceConfig(placeholders=False), ef_search=100, batch=64)
    copied = 0
    for example in examples:
        change, (reward, done) = example_changes(example.prompt)[0], example_outcomes(example.prompt)[0]
        named = "<next_state>\nno change\n" if change == "no change" else "<next_state>\nsame as example 1\n"
        outcome = f"<reward>{reward:g}</reward>\n<done>{str(done).lower()}</done>"
        if all(part in example.completion for part in ("<reasoning>same as example 1</reasoning>", named, outcome)):
            copied += 1
            assert copied_completion(example.prompt, reasoning=True) == example.completion
    assert copied > len(examples) / 4, copied


def test_the_same_step_in_another_trajectory_is_retrieved(filled, encoder, rows):
    trajectories = defaultdict(set)
    for row in rows:
        trajectories[row["task_id"], row["state"], row["action"]].add(row["trajectory_id"])
    repeated = [row for row in rows if len(trajectories[row["task_id"], row["state"], row["action"]]) > 1]
    assert len(repeated) > 20, "the dataset should repeat steps across episodes of a game"
    # Queries as a rollout makes them: the state as an AbstractState, not as text.
    queries = [{**row, "state": parse_state(row["state"])} for row in repeated]
    hits = neighbours(filled, encoder, queries, k=3, ef_search=100)
    instructions = {row["task_id"]: row["instruction"] for row in rows}
    assert all(hit["instruction"] == instructions[hit["task_id"]] for found in hits for hit in found)
    found = [[to_worked(t) for t in found] for found in hits]
    for row, worked in zip(repeated, found):
        state, next_state = states(row)
        # Another episode's identical step (TextWorld is deterministic: the same outcome too).
        assert any(
            w.action == row["action"]
            and w.location == state.location
            and w.delta == state_delta(state, next_state)
            and w.task_says == task_says(row["instruction"], state, row["action"])
            for w in worked
        ), row["action"]
    assert neighbours(None, None, repeated[:2], k=0, ef_search=100) == [[], []]


def test_queries_that_ask_the_same_are_searched_once_and_a_real_trajectory_still_sets_its_own_apart(
    filled, encoder, rows, monkeypatch
):
    import dreamgym.experience.examples as examples

    trajectories = defaultdict(set)
    for row in rows:
        trajectories[row["task_id"], row["state"], row["action"]].add(row["trajectory_id"])
    # A step two episodes took (of more, a third one's could be shown instead of the other's).
    row = next(row for row in rows if len(trajectories[row["task_id"], row["state"], row["action"]]) == 2)
    own, other = sorted(trajectories[row["task_id"], row["state"], row["action"]])
    # Two real episodes' step, the same step in two dream rollouts (ids no buffer row has) and alone.
    asked = [own, other, "dream-rollout-1", "dream-rollout-2", None]
    queries = [{**row, "state": parse_state(row["state"]), "trajectory_id": tid} for tid in asked]
    searched = []
    original = examples.search
    monkeypatch.setattr(
        examples,
        "search",
        lambda db, vectors, *a, **kw: searched.append(len(vectors)) or original(db, vectors, *a, **kw),
    )
    found = neighbours(filled, encoder, queries, k=3, ef_search=100)
    assert searched == [3]  # the two real episodes, and once for the three that exclude nothing
    shown = [[hit["trajectory_id"] for hit in hits] for hits in found]
    assert own not in shown[0] and other in shown[0]  # each real episode sees the other's step
    assert other not in shown[1] and own in shown[1]
    assert found[2] == found[3] == found[4] and found[2] is not found[3]  # alike, each its own rows
    assert found[2][0] is not found[3][0]


def test_a_wrong_preparation_is_shown_a_mistake_that_lost_and_a_right_one_a_step_that_scored(
    buffer_db, encoder, train_games, tmp_path
):
    """With mistake episodes in the buffer (collect.mistake_episodes), the first worked example of
    a preparation the recipe does not ask for is the same mistake made elsewhere, which lost the
    game, wherever the buffer holds one; that of a preparation the recipe asks for scored."""
    settings = CollectionSettings(
        "noisy-expert", 0.3, 2, seed=0, max_steps=30, mistake_episodes=6, domain="textworld-cooking"
    )
    path = collect(train_games, tmp_path / "with-mistakes.parquet", settings, progress=False).path
    table = read_transitions(path).sort_by([("trajectory_id", "ascending"), ("step", "ascending")])
    rows = table.to_pylist()
    texts = [transition_text(row["instruction"], row["state"], row["action"]) for row in rows]
    upsert_transitions(buffer_db, table, embeddings=encoder.encode(texts))
    cooking, kept = TextWorldCooking(), kept_names(rows)
    made = {  # the move (in placeholders) and how it stands to its task, of each mistake made
        (row["trajectory_id"], moved.action, moved.relation)
        for row in rows
        if row["policy"] == MISTAKE_POLICY and row["action"] != row["expert_action"]
        for moved in [situation(parse_state(row["state"]), row["action"], kept, row["instruction"], cooking)]
    }
    wrong, right = [], []
    for row in rows:
        mistakes = cooking.mistakes(row["instruction"], row["expert_action"] or "")
        if row["action"] in mistakes:
            moved = situation(parse_state(row["state"]), row["action"], kept, row["instruction"], cooking)
            if any(t != row["trajectory_id"] and (a, r) == (moved.action, moved.relation) for t, a, r in made):
                wrong.append(row)  # the same mistake was made in another episode
        elif mistakes and row["action"] == row["expert_action"]:
            right.append(row)
    queries = [{**row, "state": parse_state(row["state"])} for row in wrong + right]
    found = neighbours(buffer_db, encoder, queries, k=1, ef_search=100, pool=600, kept=kept, domain=cooking)
    assert len(wrong) >= 3 and len(right) >= 6
    assert all(row["lost"] and row["reward"] == 0 for row in wrong)  # what the game did
    assert all(hits[0]["lost"] and hits[0]["reward"] == 0 for hits in found[: len(wrong)])
    assert all(not hits[0]["lost"] and hits[0]["reward"] == 1 for hits in found[len(wrong) :])


def closest_possible(terms: tuple) -> bool:
    """Every check of `rerank.closeness` passed and every state item shared."""
    return all(term is True for term in terms[:-1]) and terms[-1] == 1.0


def test_reranking_shows_the_same_situation_first_and_more_exact_answers(filled, encoder, rows):
    kept = kept_names(rows)
    queries = [{**row, "state": parse_state(row["state"])} for row in rows]
    by_embedding = neighbours(filled, encoder, queries, k=3, ef_search=100)
    reranked = neighbours(filled, encoder, queries, k=3, ef_search=100, pool=100, kept=kept)

    def answer(row: dict) -> str:  # the step's change, in its own placeholders
        return state_delta(*states(Placeholders.own(kept, row)))

    def answered(found: list[list[dict]]) -> int:
        return sum(any(answer(hit) == answer(row) for hit in hits) for row, hits in zip(rows, found))

    # More queries get a worked example whose change is exactly their answer.
    assert answered(reranked) > answered(by_embedding), (answered(reranked), answered(by_embedding))
    pools = neighbours(filled, encoder, queries, k=100, ef_search=100)
    firsts = 0
    for row, query, hits, pool in zip(rows, queries, reranked, pools):
        assert len(hits) == 3 and all(hit["trajectory_id"] != row["trajectory_id"] for hit in hits)
        # A step seen in another episode (or the same situation elsewhere) comes first.
        own = situation(query["state"], row["action"], kept, row["instruction"], TextWorldCooking())
        same = [
            t
            for t in pool
            if closest_possible(
                closeness(
                    own,
                    stored_situation(t["state"], t["action"], kept, t["instruction"], TextWorldCooking()),
                    stored_change(t["state"], t["next_state"], t["action"], kept),
                )
            )
        ]
        if same:
            firsts += 1
            assert answer(hits[0]) in {answer(t) for t in same}
    assert firsts > 20


# --- reasoning traces --------------------------------------------------------------------------


def _trace(row: dict) -> str:
    state, next_state = states(row)
    return describe_change(state, row["action"], next_state, row["reward"], row["terminated"], row["won"])


def test_traces_say_what_moved_where_the_player_went_and_why_the_score_changed(rows):
    seen = defaultdict(int)
    for row in rows:
        state, next_state = states(row)
        trace = _trace(row).lower()
        assert 0 < len(trace) <= 400
        held_before = {item_name(i) for i in state.inventory}
        taken = {item_name(i) for i in state.visible} & {item_name(i) for i in next_state.inventory}
        for name in taken - held_before:
            assert f"{name} goes into the inventory" in trace
            seen["taken"] += 1
        if state.location != next_state.location:
            assert f"from the {state.location} to the {next_state.location}" in trace
            seen["moved"] += 1
        if state == next_state:
            assert "no effect" in trace
            seen["no effect"] += 1
        if row["reward"] > 0:
            assert f"the score rises by {row['reward']:g}" in trace
            seen["scored"] += 1
        else:
            assert "the score does not change" in trace
        if row["terminated"]:
            assert ("won" if row["won"] else "lost") in trace
            seen["won" if row["won"] else "lost"] += 1
        else:
            assert "episode ends" not in trace
    assert {"taken", "moved", "no effect", "scored", "won", "lost"} <= set(seen), seen


def test_the_prompt_quotes_what_the_task_says_of_the_object_acted_on(rows):
    """Taking a recipe's ingredient scores (the first time), taking anything else does not: the
    prompt quotes the recipe's words on the object taken, or says there are none."""
    seen = defaultdict(int)
    for row in rows:
        state = parse_state(row["state"])
        said = task_says(row["instruction"], state, row["action"])
        prompt = format_prompt(row["instruction"], [], state, row["action"], [])
        assert prompt.endswith(
            f"<action>{row['action']}</action>\n" + ("" if said is None else f"<task_says>{said}</task_says>\n")
        )
        taken = re.fullmatch(r"take (.+?)(?: from .+)?", row["action"])
        if taken is None or taken[1] in ("knife", "cookbook", "meal"):
            continue
        recipe = re.search(r"ingredients: ([^.]*)\.", row["instruction"])[1].split(", ")
        if taken[1] in recipe:
            assert said.startswith(f"of {taken[1]}: Recipe: ingredients: "), said
            assert f"the {taken[1]}" in said.split("ingredients: ")[1], said  # its directions
            seen["ingredient" + (" scored" if row["reward"] > 0 else "")] += 1
        else:
            assert said == f"nothing of {taken[1]}" and row["reward"] == 0, said
            seen["not an ingredient"] += 1
    assert {"ingredient", "ingredient scored", "not an ingredient"} <= set(seen), seen
    # The longest name at the first place the action names one; nothing for an action on no item.
    pepper = AbstractState("kitchen", ("pepper", "red pepper (on table)", "table"), (), ())
    assert acted_object(pepper, "take red pepper from table") == "red pepper"
    assert (
        task_says("Slice the red pepper. Eat.", pepper, "take red pepper from table")
        == "of red pepper: Slice the red pepper"
    )
    assert task_says("Look around.", STATE, "look") is None
    assert (
        task_says("Slice the red\n  pepper. Eat.", pepper, "take red pepper from table")
        == "of red pepper: Slice the red pepper"
    )  # one line, as a worked example shows it


def test_a_trace_states_the_reward_and_end_it_was_written_for(rows):
    """`stated_outcome` reads back what `describe_change` said, for every real step and for
    rewards the games never give (a fall, a fraction)."""
    for row in rows:
        assert stated_outcome(_trace(row)) == (row["reward"], row["terminated"])
    for reward in (-1, 0.5, 0.1 + 0.2):
        for done, won in ((False, None), (True, None), (True, False)):
            assert stated_outcome(describe_change(STATE, "open fridge", OPENED, reward, done, won)) == (reward, done)
    # Traces in other words, or with a garbled number, state nothing.
    assert stated_outcome("The fridge opens, revealing milk. Nothing is scored.") is None
    assert stated_outcome("The score rises by 1.2.3: the action advances the task.") is None


def test_a_trace_says_whether_the_state_changed_exactly_when_it_did(rows):
    """`stated_change` reads back what `describe_change` said: for every real step, whether the
    next state differs from the state (the rule that holds `no change` to the reasoning)."""
    for row in rows:
        state, next_state = states(row)
        assert stated_change(_trace(row)) == (state != next_state), row["action"]
    assert {stated_change(_trace(row)) for row in rows} == {True, False}  # the data has both
    assert stated_change(describe_change(STATE, "open fridge", OPENED, 0, False)) is True
    assert stated_change("The fridge opens, revealing milk.") is None  # other words state nothing


def test_a_trace_names_what_an_opened_container_reveals_and_changed_states():
    trace = describe_change(STATE, "open fridge", OPENED, 0, False)
    assert trace == "Effects: fridge is now open; now visible: milk. The score does not change."
    sliced = AbstractState("kitchen", ("table",), ("carrot (sliced)", "knife"), ())
    trace = describe_change(
        AbstractState("kitchen", ("table",), ("carrot", "knife"), ()), "slice carrot with knife", sliced, 1, True
    )
    assert trace == (
        "Effects: carrot is now sliced. The score rises by 1: the action advances the task. The episode ends."
    )


# --- the OpenAI-compatible annotator against a real HTTP server ----------------------------------


class _ChatHandler(BaseHTTPRequestHandler):
    """Answers /<case>/chat/completions like an OpenAI-compatible server would for that case."""

    replies: ClassVar[dict[str, tuple[int, dict]]] = {
        "/ok/chat/completions": (
            200,
            {"choices": [{"message": {"role": "assistant", "content": "  The fridge opens,\n revealing milk. "}}]},
        ),
        "/empty/chat/completions": (200, {"choices": [{"message": {"role": "assistant", "content": ""}}]}),
        "/broken/chat/completions": (500, {"error": {"message": "model crashed"}}),
    }

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.server.requests.append((self.path, json.loads(self.rfile.read(length))))
        status, reply = self.replies.get(self.path, (404, {"error": "no such route"}))
        payload = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def chat_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_openai_annotator_asks_the_endpoint_and_reports_failures(chat_server):
    base = f"http://127.0.0.1:{chat_server.server_address[1]}"
    annotator = OpenAIAnnotator(f"{base}/ok/", "strong-model", timeout=5)
    assert (
        annotator(STATE, "open fridge", OPENED, 0.0, False, task="Cook the milk.")
        == "The fridge opens, revealing milk."
    )
    path, body = chat_server.requests[-1]
    assert path == "/ok/chat/completions" and body["model"] == "strong-model"
    assert "Task: Cook the milk.\n" in body["messages"][-1]["content"]
    assert "Action: open fridge" in body["messages"][-1]["content"]
    assert format_state(OPENED) in body["messages"][-1]["content"]

    closed = ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    nobody = f"http://127.0.0.1:{closed.server_address[1]}"
    closed.server_close()
    for url, problem in (
        (f"{base}/broken", "HTTP 500: .*model crashed"),
        (f"{base}/empty", "empty answer"),
        (nobody, "request failed"),
    ):
        with pytest.raises(AnnotatorError, match=problem):
            OpenAIAnnotator(url, "strong-model", timeout=5)(STATE, "open fridge", OPENED, 0, False)


def test_make_annotator_follows_the_config():
    assert make_annotator(ExperienceConfig()) is describe_change
    remote = make_annotator(ExperienceConfig(annotator="openai", annotator_url="http://h:8000/v1", annotator_model="m"))
    assert isinstance(remote, OpenAIAnnotator) and remote.url == "http://h:8000/v1/chat/completions"
