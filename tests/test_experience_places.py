"""Places the episode has been (experience/places.py): where a move leads, learnt from the episode
and the training data's ways back, and the room as the episode left it."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import TINY_EXPERIENCE

from dreamgym.buffer.store import upsert_transitions
from dreamgym.data.collect import CollectionSettings, collect
from dreamgym.data.schema import read_transitions, to_table
from dreamgym.envs.dynamics import Query
from dreamgym.envs.textworld.config import GamesConfig
from dreamgym.envs.textworld.games import generate_games, plan_games
from dreamgym.experience.affordances import Affordances, learnt_from_rows, learnt_returns
from dreamgym.experience.examples import queries_of
from dreamgym.experience.generate import NeighbourCopy
from dreamgym.experience.places import RememberedPlaces, destination, remembered
from dreamgym.state import AbstractState, format_state, parse_state

HALL = AbstractState("hall", ("rug",), (), ("go east", "look"))
KITCHEN = AbstractState("kitchen", ("apple (on table)", "table"), (), ("go west", "take apple from table"))
KITCHEN_TAKEN = AbstractState("kitchen", ("table",), ("apple",), ("eat apple", "go west", "put apple on table"))


def row(trajectory: str, step: int, state: AbstractState, action: str, after: AbstractState) -> dict:
    return {
        "trajectory_id": trajectory,
        "step": step,
        "state": format_state(state),
        "action": action,
        "next_state": format_state(after),
    }


def test_a_way_back_is_learnt_only_from_returns_that_agree():
    there_and_back = [row("t1", 0, HALL, "go east", KITCHEN), row("t1", 1, KITCHEN, "go west", HALL)]
    twice = there_and_back + [{**r, "trajectory_id": "t2"} for r in there_and_back]
    assert learnt_returns(there_and_back) == {}  # one return is not enough
    assert learnt_returns(twice) == {"go east": "go west", "go west": "go east"}
    # A third episode that came back another way: the two ways disagree, nothing is learnt.
    other_way = [row("t3", 0, HALL, "go east", KITCHEN), row("t3", 1, KITCHEN, "climb down", HALL)]
    assert "go east" not in learnt_returns(twice + other_way)


def test_a_move_leads_where_the_episode_went_or_back_the_way_it_came():
    returns = {"go east": "go west", "go west": "go east"}
    went_east = Query("", KITCHEN, "go west", earlier=((HALL, "go east"),))
    assert destination(went_east, returns) == "hall"  # the way back
    assert destination(went_east, {}) is None  # no way back learnt
    assert destination(Query("", KITCHEN, "go north", earlier=((HALL, "go east"),)), returns) is None
    back_in_hall = Query("", HALL, "go east", earlier=((HALL, "go east"), (KITCHEN, "go west")))
    assert destination(back_in_hall, {}) == "kitchen"  # the episode took this very move


def test_a_room_comes_back_as_it_was_left_with_what_is_carried_now():
    affordances = Affordances.learn([HALL, KITCHEN, KITCHEN_TAKEN], None)
    affordances.returns = {"go east": "go west", "go west": "go east"}
    hall_again = Query("", HALL, "go east", earlier=((HALL, "go east"), (KITCHEN, "go west")))
    assert remembered(hall_again, affordances) == KITCHEN  # the episode's own move, the room as left
    back = Query("", KITCHEN, "go west", earlier=((HALL, "go east"),))
    assert remembered(back, affordances) == HALL  # as it was, nothing carried then or now
    carried_out = Query(
        "",
        AbstractState("hall", ("rug",), ("apple",), ("eat apple", "go east", "look")),
        "go east",
        earlier=((HALL, "go east"), (KITCHEN, "take apple from table"), (KITCHEN_TAKEN, "go west")),
    )
    assert remembered(carried_out, affordances) == KITCHEN_TAKEN
    # The apple eaten in the hall: the kitchen without it, and without the actions on it.
    eaten = Query(
        "",
        HALL,
        "go east",
        earlier=(*carried_out.earlier, (carried_out.state, "eat apple")),
    )
    assert remembered(eaten, affordances) == AbstractState("kitchen", ("table",), (), ("go west",))
    not_a_move = Query("", KITCHEN, "take apple from table", earlier=((HALL, "go east"),))
    assert remembered(not_a_move, affordances) is None


@pytest.fixture(scope="module")
def walks(tmp_path_factory):
    """Noisy-expert episodes on real games with six rooms: they fetch what the recipe needs from
    other rooms and come back."""
    folder = tmp_path_factory.mktemp("places")
    games = GamesConfig(recipe=(2,), take=(2,), go=(6,), train_count=2, test_count=1)
    paths, _ = generate_games(plan_games(games, "train", 2, seed=3), folder / "games", workers=2, progress=False)
    out = folder / "walks.parquet"
    collect(paths, out, CollectionSettings("noisy-expert", 0.3, 4, seed=0, max_steps=40), workers=2, progress=False)
    rows = read_transitions(out).to_pylist()
    return sorted(rows, key=lambda r: (r["trajectory_id"], r["step"]))


def test_on_real_games_a_move_back_gives_the_room_the_game_shows(walks):
    affordances = learnt_from_rows(walks, None)
    assert affordances.returns and all(affordances.returns[back] == way for way, back in affordances.returns.items())
    answered = unchanged = 0
    for query, transition in zip(queries_of(walks, 3), walks):
        predicted = remembered(query, affordances)
        if predicted is None:
            continue
        real = parse_state(transition["next_state"])
        answered += 1
        assert real.location != query.state.location  # only moves are answered
        assert (predicted.location, predicted.visible, predicted.inventory) == (
            real.location,
            real.visible,
            real.inventory,
        )
        left_with = next(state for state, _ in reversed(query.earlier) if state.location == real.location)
        if left_with.inventory == query.state.inventory:
            unchanged += 1
            assert predicted == real  # actions and all
    assert answered >= 3 and unchanged >= 1


def test_the_memory_is_a_layer_over_the_copy_that_stands_for_no_lm_as_over_the_lm(walks, buffer_db, encoder):
    """The ablation's no-LM row has the model's rule layers on (experience/ablation.py): over the
    copy of the top example, a move back into a room the episode has been gives the room as the
    episode left it; the reward and the end stay the copy's, and a failure stays a failure."""
    upsert_transitions(buffer_db, to_table(walks), embed=encoder.encode)
    config = dataclasses.replace(TINY_EXPERIENCE, neighbours=1, retrieval_pool=50)
    assert config.remember_places  # the default: on for the model and for its copy alike
    affordances = learnt_from_rows(walks, None)
    copier = NeighbourCopy(config, buffer_db, encoder, 100, affordances=affordances)
    layered = copier.dynamics()
    assert isinstance(layered, RememberedPlaces) and layered.history == copier.history
    assert copier.dynamics() is layered  # one object: DreamEnvs that step together share their model
    queries = queries_of(walks, config.history)
    places = [remembered(query, affordances) for query in queries]
    moves_back = [i for i, place in enumerate(places) if place is not None]
    asked = [queries[i] for i in moves_back]
    for index, plain, with_memory in zip(moves_back, copier.predict(asked), layered.predict(asked), strict=True):
        assert plain.ok == with_memory.ok
        if plain.ok:
            assert with_memory.completion.next_state == places[index]
            assert (with_memory.completion.reward, with_memory.completion.done) == (
                plain.completion.reward,
                plain.completion.done,
            )
    replaced = sum(p.ok and p.completion.next_state != places[i] for i, p in zip(moves_back, copier.predict(asked)))
    assert replaced >= 1  # the memory changed some of the copy's answers
    # Switched off, the copy is the copy alone.
    off = dataclasses.replace(config, remember_places=False)
    alone = NeighbourCopy(off, buffer_db, encoder, 100, affordances=affordances)
    assert alone.dynamics() is alone
