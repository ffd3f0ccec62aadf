"""Re-ranking of retrieved neighbours by situation (rerank.py): the pure ranking rules; the ranking
on a real buffer is tested with the other retrieval tests in test_experience_format.py."""

from __future__ import annotations

from dreamgym.experience.rerank import Situation, closeness, closest, situation
from dreamgym.state import AbstractState

KEPT = frozenset({"counter", "fridge", "knife", "table"})


def kitchen(food: str, fridge: str = "closed", knife: bool = False) -> AbstractState:
    carried = ("knife",) if knife else ()
    return AbstractState("kitchen", (f"fridge ({fridge})", f"{food} (on counter)", "counter"), carried,
                         ("close fridge" if fridge == "open" else "open fridge",
                          f"take {food} from counter"))


def test_the_same_move_on_another_food_is_the_same_situation_with_placeholders():
    tomato = situation(kitchen("tomato"), "take tomato from counter", KEPT)
    assert tomato == situation(kitchen("carrot"), "take carrot from counter", KEPT)
    assert tomato.action == "take obj1 from counter"
    # Without placeholders only the kept names and the room are shared.
    raw = situation(kitchen("tomato"), "take tomato from counter", None)
    other = situation(kitchen("carrot"), "take carrot from counter", None)
    assert raw.action != other.action and closeness(raw, other)[1] < 1
    # The open fridge is a different situation: the same move, 4 of 8 items in common (room,
    # counter, food, its take; not the fridge nor its open/close).
    opened = situation(kitchen("carrot", fridge="open"), "take carrot from counter", KEPT)
    assert closeness(tomato, opened) == (True, 4 / 8)


def test_closest_ranks_the_same_action_first_then_shared_items_then_given_order():
    query = Situation("take obj1 from counter", frozenset({"a", "b", "c", "d"}))
    candidates = [
        Situation("open fridge", frozenset({"a", "b", "c", "d"})),            # all items, other move
        Situation("take obj1 from counter", frozenset({"a"})),                 # the move, 1 of 4
        Situation("take obj1 from counter", frozenset({"a", "b", "c", "e"})),  # the move, 3 of 5
        Situation("take obj1 from counter", frozenset({"a", "b", "c", "f"})),  # a tie with the one before
    ]
    assert closest(query, candidates, 4) == [2, 3, 1, 0]
    assert closest(query, candidates, 2) == [2, 3]
    assert closest(query, [], 3) == []
    empty = Situation("look", frozenset())
    assert closeness(empty, empty) == (True, 1.0)
