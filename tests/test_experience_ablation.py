"""The ablation rows (the LM and its rule layers, each without the other), the copy that stands
for no LM, and their tables."""

import dataclasses

from conftest import TINY_EXPERIENCE as TINY

from dreamgym.buffer.store import upsert_transitions
from dreamgym.config import load_config
from dreamgym.data.schema import read_transitions, to_table
from dreamgym.envs.dynamics import Query
from dreamgym.experience.ablation import (
    FULL,
    LM_ONLY,
    NO_LM_NO_RULES,
    RULES_ONLY,
    ablation_rows,
    markdown,
    plot,
    trained,
    variants,
)
from dreamgym.experience.affordances import learnt_from_rows
from dreamgym.experience.format import apply_delta, example_changes, example_outcomes, fits
from dreamgym.experience.generate import NeighbourCopy
from dreamgym.state import parse_state


def test_each_row_differs_from_the_full_model_in_one_thing(tmp_path):
    config = load_config("params.yaml")
    rows = variants(config)
    assert list(rows) == [
        FULL,
        RULES_ONLY,
        LM_ONLY,
        NO_LM_NO_RULES,
        "- memory of places",
        "- learnt actions (and places)",
        "- domain rules",
        "no retrieval (k=0)",
        "no history (h=0)",
        "no reasoning",
    ]
    changed = {
        name: {key for key, value in vars(row.config.experience).items() if value != getattr(config.experience, key)}
        for name, row in rows.items()
    }
    no_rules = {"domain", "learnt_actions", "remember_places"}
    assert changed == {
        FULL: set(),
        RULES_ONLY: set(),  # the same rule layers as the model row: only the LM is gone
        LM_ONLY: no_rules,
        NO_LM_NO_RULES: no_rules,
        "- memory of places": {"remember_places"},
        "- learnt actions (and places)": {"learnt_actions", "remember_places"},
        "- domain rules": {"domain"},
        "no retrieval (k=0)": {"neighbours"},
        "no history (h=0)": {"history"},
        "no reasoning": {"reasoning"},
    }
    assert [name for name, row in rows.items() if row.copied] == [RULES_ONLY, NO_LM_NO_RULES]
    # The copies use the model of the row they copy for; removing the memory of places (a
    # generation setting) uses the full model; every other row trains its own.
    assert {name: row.model_of for name, row in rows.items() if row.model_of != name} == {
        RULES_ONLY: FULL,
        NO_LM_NO_RULES: LM_ONLY,
        "- memory of places": FULL,
    }
    assert set(trained(rows)) == set(rows) - {RULES_ONLY, NO_LM_NO_RULES, "- memory of places"}
    assert all(row.config.seed == config.seed and row.config.buffer == config.buffer for row in rows.values())


def test_a_layer_the_config_has_off_already_gives_no_row_and_no_retrieval_no_copy():
    config = load_config("params.yaml", {"experience.remember_places": False, "experience.neighbours": 0})
    rows = variants(config)
    assert "- memory of places" not in rows and "no retrieval (k=0)" not in rows
    assert RULES_ONLY not in rows and NO_LM_NO_RULES not in rows  # nothing retrieved to copy


def test_table_and_plot(tmp_path):
    fidelity = {
        "next_state_exact_match": 0.5,
        "reward_accuracy": 0.9,
        "done_accuracy": 1.0,
        "parse_failure_rate": 0.05,
        "transitions": 200,
        "foreseeable_fraction": 0.75,
        "foreseeable": {"next_state_exact_match": 0.6},
        "field_f1": {"location": 1.0, "visible": 0.8, "inventory": 0.9, "actions": 0.7},
        "multi_step": [{"step": 1, "exact_match": 0.5}, {"step": 2, "exact_match": 0.25}],
    }
    rows = ablation_rows({FULL: fidelity, "no reasoning": {**fidelity, "multi_step": []}}, "data/games/test")
    rows += ablation_rows({FULL: {**fidelity, "foreseeable_fraction": 0.5}}, "shifted")
    assert rows[0]["open_loop_exact_at_last_step"] == 0.25 and rows[1]["open_loop_exact_at_last_step"] is None
    assert rows[0]["f1_actions"] == 0.7 and rows[0]["foreseeable_exact_match"] == 0.6
    table = markdown(rows).splitlines()
    assert table[0] == "**data/games/test** (200 transitions, 75.0% foreseeable)"
    assert table[4] == f"| {FULL} | 50.0% | 60.0% | 90.0% | 100.0% | 5.0% | 25.0% |"
    assert table[5].endswith("| - |")
    assert table[7] == "**shifted** (200 transitions, 50.0% foreseeable)"
    assert plot(rows, tmp_path / "ablation.png").stat().st_size > 1000


def test_no_model_copies_the_top_neighbours_change_and_fails_where_it_does_not_fit(
    buffer_db, encoder, offline_dataset, first_episode
):
    rows = read_transitions(offline_dataset).to_pylist()
    upsert_transitions(buffer_db, to_table(rows), embed=encoder.encode)
    config = dataclasses.replace(TINY, neighbours=1, retrieval_pool=50)
    # Its examples' changes are shown with the actions learnt from the buffer's rows (the default).
    copier = NeighbourCopy(config, buffer_db, encoder, 100, affordances=learnt_from_rows(rows, None))
    # The query's own episode is never retrieved: its neighbours come from the other episodes.
    queries = [
        Query(row["instruction"], parse_state(row["state"]), row["action"], (), row["trajectory_id"])
        for row in first_episode
    ]
    predictions = copier.predict(queries)
    for query, prompt, prediction in zip(queries, copier.prompts(queries), predictions):
        change, (reward, done) = example_changes(prompt)[0], example_outcomes(prompt)[0]
        if fits(query.state, change):
            assert prediction.ok and prediction.completion.next_state == apply_delta(query.state, change)
            assert (prediction.completion.reward, prediction.completion.done) == (reward, done)
        else:  # an explicit failure, tried once: a copy is the same every time
            assert not prediction.ok and prediction.attempts == 1 and "does not fit" in prediction.error
    # The other episodes of this game make the same moves: most copies are what the game did.
    exact = sum(
        p.ok and p.completion.next_state == parse_state(row["next_state"]) for p, row in zip(predictions, first_episode)
    )
    assert exact >= len(first_episode) // 2, exact
