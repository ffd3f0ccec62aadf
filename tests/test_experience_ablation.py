"""The ablation variants, the row without a model, and their table."""

import dataclasses

from conftest import TINY_EXPERIENCE as TINY

from dreamgym.buffer.store import upsert_transitions
from dreamgym.config import load_config
from dreamgym.data.schema import read_transitions, to_table
from dreamgym.envs.dynamics import Query
from dreamgym.experience.ablation import ablation_rows, markdown, plot, variant_configs
from dreamgym.experience.affordances import learnt_from_rows
from dreamgym.experience.format import apply_delta, example_changes, example_outcomes, fits
from dreamgym.experience.generate import NeighbourCopy
from dreamgym.state import parse_state


def test_each_variant_switches_off_one_part_and_keeps_the_rest(tmp_path):
    config = load_config("params.yaml")
    variants = variant_configs(config)
    assert list(variants) == ["full", "no retrieval (k=0)", "no history (h=0)", "no reasoning"]
    assert variants["full"] == config
    changed = {
        name: {key for key, value in vars(variant.experience).items() if value != getattr(config.experience, key)}
        for name, variant in variants.items()
    }
    assert changed == {
        "full": set(),
        "no retrieval (k=0)": {"neighbours"},
        "no history (h=0)": {"history"},
        "no reasoning": {"reasoning"},
    }
    assert all(variant.seed == config.seed and variant.buffer == config.buffer for variant in variants.values())


def test_table_and_plot(tmp_path):
    fidelity = {
        "next_state_exact_match": 0.5,
        "reward_accuracy": 0.9,
        "done_accuracy": 1.0,
        "parse_failure_rate": 0.05,
        "field_f1": {"location": 1.0, "visible": 0.8, "inventory": 0.9, "actions": 0.7},
        "multi_step": [{"step": 1, "exact_match": 0.5}, {"step": 2, "exact_match": 0.25}],
    }
    rows = ablation_rows({"full": fidelity, "no reasoning": {**fidelity, "multi_step": []}})
    assert rows[0]["open_loop_exact_at_last_step"] == 0.25 and rows[1]["open_loop_exact_at_last_step"] is None
    assert rows[0]["f1_actions"] == 0.7
    table = markdown(rows).splitlines()
    assert table[2] == "| full | 50.0% | 90.0% | 100.0% | 5.0% | 25.0% |"
    assert table[3].endswith("| - |")
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
