"""Re-ranking of retrieved neighbours by situation (rerank.py): the pure ranking rules; the ranking
on a real buffer is tested with the other retrieval tests in test_experience_format.py."""

from __future__ import annotations

from dataclasses import replace

from dreamgym.domain import NO_RULES
from dreamgym.envs.textworld.cooking import TextWorldCooking
from dreamgym.experience import rerank
from dreamgym.experience.examples import on_the_query_items, on_the_task_items
from dreamgym.experience.format import applied, state_delta
from dreamgym.experience.rerank import RANKING_KEYS, Situation, closeness, closest
from dreamgym.state import AbstractState, format_state, item_name, parse_state

COOKING = TextWorldCooking()  # the rules these tests are about
task_relation = COOKING.task_relation


def situation(state, action: str, kept, instruction: str | None = None) -> Situation:
    return rerank.situation(state, action, kept, instruction, COOKING)


KEPT = frozenset({"counter", "fridge", "knife", "table"})


def kitchen(food: str, fridge: str = "closed", knife: bool = False) -> AbstractState:
    carried = ("knife",) if knife else ()
    return AbstractState(
        "kitchen",
        (f"fridge ({fridge})", f"{food} (on counter)", "counter"),
        carried,
        ("close fridge" if fridge == "open" else "open fridge", f"take {food} from counter"),
    )


def test_the_same_move_on_another_food_is_the_same_situation_with_placeholders():
    tomato = situation(kitchen("tomato"), "take tomato from counter", KEPT)
    carrot = situation(kitchen("carrot"), "take carrot from counter", KEPT)
    assert tomato == replace(carrot, kinds=tomato.kinds)  # only the real kinds differ
    assert tomato.action == "take obj1 from counter" and tomato.kinds == {"tomato", "counter"}
    # Without placeholders only the kept names and the room are shared.
    raw = situation(kitchen("tomato"), "take tomato from counter", None)
    other = situation(kitchen("carrot"), "take carrot from counter", None)
    assert raw.action != other.action and closeness(raw, other)[-1] < 1
    assert tomato.acted == {"visible: obj1 (on counter)", "visible: counter"}
    # The open fridge is a different situation: the same move on the same items, 4 of 8 items in
    # common (room, counter, food, its take; not the fridge nor its open/close). No change given:
    # none is known to fit.
    opened = situation(kitchen("carrot", fridge="open"), "take carrot from counter", KEPT)
    assert closeness(tomato, opened) == (True, True, False, True, True, True, False, True, 4 / 8)


def test_closest_ranks_the_same_action_first_then_shared_items_then_given_order():
    query = Situation("take obj1 from counter", frozenset({"a", "b", "c", "d"}))
    candidates = [
        Situation("open fridge", frozenset({"a", "b", "c", "d"})),  # all items, other move
        Situation("take obj1 from counter", frozenset({"a"})),  # the move, 1 of 4
        Situation("take obj1 from counter", frozenset({"a", "b", "c", "e"})),  # the move, 3 of 5
        Situation("take obj1 from counter", frozenset({"a", "b", "c", "f"})),  # a tie with the one before
    ]
    assert closest(query, candidates, 4) == [2, 3, 1, 0]
    assert closest(query, candidates, 2) == [2, 3]
    assert closest(query, [], 3) == []
    # Fewer than k with the move: the others follow, ranked among themselves.
    candidates.append(Situation("go east", frozenset({"a", "b", "c", "d", "e"})))  # 4 of 5, other move
    assert closest(query, candidates, 5) == [2, 3, 1, 0, 4]
    everything = sorted(range(5), key=lambda i: closeness(query, candidates[i]), reverse=True)
    assert all(closest(query, candidates, k) == everything[:k] for k in range(1, 6))
    # A key switched off counts the same for every candidate: the next one decides.
    assert closest(query, candidates, 2, off=frozenset({"action", "action_form"})) == [0, 4]  # the most items in common
    assert closest(query, candidates, 3, off=frozenset({"shared_items"})) == [1, 2, 3]  # the given order
    assert closeness(query, candidates[0], off=frozenset(RANKING_KEYS)) == (False,) * 8 + (0.0,)
    empty = Situation("look", frozenset())
    assert closeness(empty, empty) == (True, True, False, True, True, True, True, True, 1.0)


def carrying(food: str, *more: str) -> AbstractState:
    return AbstractState(
        "kitchen", ("counter", "table"), ("knife", food, *more), (f"chop {item_name(food)} with knife", "look")
    )


def test_a_change_that_fits_and_the_same_acted_on_items_come_before_shared_items():
    query = situation(carrying("carrot (roasted)", "egg", "flour"), "chop carrot with knife", KEPT)
    # Fried, carrying the query's other foods: more items in common, but its change removes
    # `obj1 (fried)`, which the query's state lacks.
    fried = situation(carrying("tomato (fried)", "egg", "flour"), "chop tomato with knife", KEPT)
    roasted = situation(carrying("tomato (roasted)"), "chop tomato with knife", KEPT)
    changes = [
        "inventory: -obj1 (fried); +obj1 (chopped, fried)",
        "inventory: -obj1 (roasted); +obj1 (chopped, roasted)",
    ]
    assert closeness(query, fried)[-1] > closeness(query, roasted)[-1]
    assert closeness(query, fried, changes[0])[:3] == (True, True, False)
    assert closeness(query, roasted, changes[1])[:3] == (True, True, True)
    assert closest(query, [fried, roasted], 2, changes) == [1, 0]
    # No change known: the one whose acted-on items are the query's comes first, though it shares
    # fewer items.
    assert query.acted == {"inventory: obj1 (roasted)", "inventory: knife"} == roasted.acted != fried.acted
    assert closest(query, [fried, roasted], 2) == [1, 0]
    # An object is named as a whole: an action on food1 does not act on food10.
    assert situation(carrying("food1", "food10"), "eat food1", None).acted == {"inventory: food1"}


def test_a_candidate_in_the_same_relation_to_its_task_comes_before_shared_items():
    recipe = "Recipe: ingredients: carrot. directions: chop the carrot; fry the carrot; prepare meal."
    held = carrying("carrot")
    assert task_relation(recipe, held, "chop carrot with knife") == (True, frozenset({"chop"}))
    assert task_relation(recipe, held, "slice carrot with knife") == (True, frozenset())
    assert task_relation("Recipe: ingredients: egg.", held, "slice carrot with knife") == (False, frozenset())
    assert task_relation(recipe, held, "look") is None
    # The objective names the cookbook; the recipe does not ask for it.
    cookbook = AbstractState("kitchen", ("cookbook (on table)", "table"), (), ("take cookbook from table",))
    objective = f"Check the cookbook in the kitchen for the recipe. {recipe}"
    assert task_relation(objective, cookbook, "take cookbook from table") == (False, frozenset())
    assert task_relation(None, held, "chop carrot with knife") is None
    # A cooking move names its tool, not the recipe's verb: the stove fries, the oven roasts.
    assert task_relation(recipe, held, "cook carrot with stove") == (True, frozenset({"fry"}))
    assert task_relation(recipe, held, "cook carrot with oven") == (True, frozenset())
    # The query slices what its recipe says to chop, which loses the game. Of two candidates
    # slicing a tomato, the one whose recipe said to slice it (it scored) shares more items; the
    # one whose recipe said to dice it (lost, like the query) comes first.
    query = situation(carrying("carrot", "egg"), "slice carrot with knife", KEPT, recipe)
    sliced = situation(
        carrying("tomato", "egg"),
        "slice tomato with knife",
        KEPT,
        "Recipe: ingredients: tomato. directions: slice the tomato.",
    )
    diced = situation(
        carrying("tomato"), "slice tomato with knife", KEPT, "Recipe: ingredients: tomato. directions: dice the tomato."
    )
    assert closeness(query, sliced)[-1] > closeness(query, diced)[-1]
    assert closeness(query, diced)[3] and not closeness(query, sliced)[3]
    assert closest(query, [sliced, diced], 2) == [1, 0]


def test_a_change_whose_actions_need_an_open_fridge_comes_after_one_that_does_not():
    """`+insert obj1 into fridge` comes with taking the food only where the fridge is open."""
    query = situation(kitchen("carrot", fridge="closed"), "take carrot from counter", KEPT)
    opened = situation(kitchen("tomato", fridge="open"), "take tomato from counter", KEPT)
    closed = situation(
        AbstractState(
            "hall",
            ("chair", "counter", "fridge (closed)", "lamp", "rug", "sofa", "tomato (on counter)"),
            (),
            ("open fridge", "take tomato from counter"),
        ),
        "take tomato from counter",
        KEPT,
    )
    changes = [
        "visible: -obj1\ninventory: +obj1\nactions: -take obj1 from counter; +insert obj1 into fridge",
        "visible: -obj1\ninventory: +obj1\nactions: -take obj1 from counter; +eat obj1",
    ]
    assert closeness(query, opened)[-1] > closeness(query, closed)[-1]  # more items in common
    assert closeness(query, opened, changes[0])[:6] == (True, True, True, True, True, False)
    assert closeness(query, closed, changes[1])[:6] == (True, True, True, True, True, True)
    assert closest(query, [opened, closed], 2, changes) == [1, 0]
    # A change naming nothing open or closed is alike anywhere.
    assert closeness(query, opened, changes[1])[5]


def test_of_two_candidates_alike_so_far_the_one_acting_on_the_same_kind_comes_first():
    """A placeholder hides that the query takes a potato (inedible raw); the ranking sees it."""
    query = situation(kitchen("purple potato"), "take purple potato from counter", KEPT)
    tomato = situation(kitchen("red tomato"), "take red tomato from counter", KEPT)
    potato = situation(
        AbstractState(
            "hall",
            ("chair", "counter", "fridge (closed)", "lamp", "yellow potato (on counter)"),
            (),
            ("open fridge", "take yellow potato from counter"),
        ),
        "take yellow potato from counter",
        KEPT,
    )
    assert query.kinds == potato.kinds == {"potato", "counter"} != tomato.kinds
    changes = [
        "visible: -obj1\ninventory: +obj1\nactions: -take obj1 from counter; +eat obj1",
        "visible: -obj1\ninventory: +obj1\nactions: -take obj1 from counter",
    ]
    assert closeness(query, tomato)[-1] > closeness(query, potato)[-1]  # more items in common
    assert closest(query, [tomato, potato], 2, changes) == [1, 0]


def test_of_the_same_move_the_one_made_at_the_same_score_comes_first():
    """ScienceWorld pays the first move to another room (a subgoal) and no later one; the state
    does not show which move is the first, the score before it does. Generic: no domain rule."""
    hallway = AbstractState(
        "hallway",
        ("door to art studio (open)", "door to kitchen (open)", "drawing"),
        (),
        ("focus on drawing", "go to art studio", "go to kitchen", "look around"),
    )

    def going(score: float | None) -> Situation:
        return rerank.situation(hallway, "go to kitchen", None, "find a(n) animal", NO_RULES, score)

    # Stored rows give their score after the step less its reward (17 - 8.33: within a point of 8.33).
    later, first = going(17.0), going(17 - 8.33)
    assert closest(going(8.33), [later, first], 1) == [1]
    assert closest(going(17.0), [first, later], 1) == [1]
    # An unknown score (a row or query without one) is alike any: the order given decides.
    assert closest(going(None), [later, first], 1) == [0]
    assert closest(going(8.33), [going(None), first], 1) == [0]
    # Only as a later key: the same action still comes first.
    other_move = rerank.situation(hallway, "go to art studio", None, "find a(n) animal", NO_RULES, 8.33)
    assert closest(going(8.33), [other_move, later], 1) == [1]
    progress_off = frozenset({"progress"})
    assert closeness(going(8.33), later, off=progress_off) == closeness(going(8.33), first, off=progress_off)


def test_the_closest_one_found_key_by_key_is_the_first_of_the_full_ranking():
    import random

    rng = random.Random(0)
    state = carrying("obj1 (roasted)", "egg")
    changes = [
        None,
        "inventory: -obj1; +obj1 (chopped, roasted)",  # fits
        "inventory: -obj1 (fried); +obj1 (chopped, fried)",  # does not
        "no change",
        "actions: -chop obj1 with knife",
    ]
    items = [f"visible: thing{n}" for n in range(6)]
    for _ in range(300):

        def drawn() -> Situation:
            return Situation(
                rng.choice(["chop obj1 with knife", "look"]),
                frozenset(rng.sample(items, rng.randint(0, 4))),
                frozenset(rng.sample(items[:2], rng.randint(0, 1))),
                state,
                rng.choice([None, "a", "b"]),
                frozenset(rng.sample(["carrot", "knife"], rng.randint(0, 2))),
                COOKING,
                score=rng.choice([None, 0.0, 8.33, 8.67, 17.0]),
            )

        query, candidates = drawn(), [drawn() for _ in range(rng.randint(1, 12))]
        picked = [rng.choice(changes) for _ in candidates]
        off = frozenset(rng.sample(RANKING_KEYS, rng.choice([0, 0, 1, 2])))
        ranked = sorted(
            range(len(candidates)), key=lambda i: closeness(query, candidates[i], picked[i], off), reverse=True
        )
        assert closest(query, candidates, 1, picked, off) == ranked[:1]


def hall(doors: dict[str, str]) -> AbstractState:
    """A room with the given doors, each open or closed, the way each leads and the moves they allow."""
    ways = {"screen door": "west", "frosted-glass door": "east", "plain door": "south"}
    actions = ["look"]
    for door, status in doors.items():
        actions += [f"close {door}", f"go {ways[door]}"] if status == "open" else [f"open {door}"]
    visible = tuple(f"{door} ({status}, {ways[door]})" for door, status in doors.items())
    return AbstractState("hall", visible, (), tuple(actions))


def test_the_same_move_on_another_item_comes_before_other_moves_and_is_shown_on_the_querys_item():
    query_state = hall({"screen door": "closed", "frosted-glass door": "closed"})
    query = situation(query_state, "open screen door", KEPT)
    assert query.form == "open {0}"
    # No candidate opens the screen door. One closes a door in the query's very state; one opens
    # another door elsewhere: the same move, on another item, comes first.
    beside = hall({"screen door": "closed", "frosted-glass door": "closed", "plain door": "open"})
    closing = situation(beside, "close plain door", KEPT)
    there = hall({"frosted-glass door": "closed", "plain door": "closed"})
    opening = situation(there, "open frosted-glass door", KEPT)
    assert closeness(query, closing)[-1] > closeness(query, opening)[-1]
    assert closest(query, [closing, opening], 1) == [1]
    # Shown as it was, that example's change opens the frosted-glass door, which the query's state
    # has too, and adds the way east. On the query's item it opens the screen door, and the way is
    # the screen door's; the other door is the example's, the two swapped throughout.
    row = {"instruction": "open the doors", "state": format_state(there), "action": "open frosted-glass door"}
    row["next_state"] = format_state(hall({"frosted-glass door": "open", "plain door": "closed"}))
    swapped = on_the_query_items(row, "open screen door", query_state)
    assert swapped["action"] == "open screen door"
    change = state_delta(parse_state(swapped["state"]), parse_state(swapped["next_state"]))
    assert "+go west" in change and "east" not in change
    assert applied(query_state, change).visible == ("frosted-glass door (closed, east)", "screen door (open, west)")
    # Another move, or the same one on the same items, is left as it is.
    assert on_the_query_items(row, "close screen door", query_state) == row
    assert on_the_query_items(row, "open frosted-glass door", query_state) == row
    # A difference that is also a move's first word (open, closed) is not swapped: `open oven`
    # would become `closed oven`. Only the names are.
    ajar = AbstractState("hall", ("screen door (open, east)",), (), ("close screen door", "go east", "look"))
    assert "screen door (closed, east)" in on_the_query_items(row, "open screen door", ajar)["state"]
    # Two slots: both items are the query's.
    take = {"state": format_state(kitchen("apple")), "action": "take apple from counter"}
    take["next_state"] = take["state"]
    swapped = on_the_query_items(take, "take tomato from fridge", kitchen("tomato"))
    assert swapped["action"] == "take tomato from fridge"
    assert "fridge (closed)" not in swapped["state"] and "counter (closed)" in swapped["state"]


def _recipe(*ingredients: str) -> str:
    return f"Cook a meal. Recipe: ingredients: {', '.join(ingredients)}. directions: prepare meal."


def test_a_move_that_uses_up_the_recipes_items_uses_up_the_querys_own():
    # The example's recipe asks for two of the three things it carries; `prepare meal` uses up those
    # two. The query's recipe asks for three of its four, numbered otherwise.
    made_in = AbstractState("kitchen", ("stove",), ("obj1 (fried)", "obj2", "obj3 (sliced)"), ("prepare meal",))
    made = AbstractState("kitchen", ("stove",), ("meal", "obj2"), ())
    change = state_delta(made_in, made)
    ours = AbstractState(
        "kitchen", ("stove",), ("obj1", "obj2 (diced)", "obj3 (roasted)", "obj4 (sliced)"), ("prepare meal",)
    )
    told = on_the_task_items(
        change, made_in, _recipe("obj1", "obj3"), ours, _recipe("obj2", "obj3", "obj4"), "prepare meal", COOKING
    )
    assert applied(ours, told).inventory == ("meal", "obj1")
    # Shown as it was, it used up the query's obj1, which its recipe does not ask for.
    assert applied(ours, change).inventory == ("meal", "obj2 (diced)", "obj4 (sliced)")
    # Where the example uses up anything else, or names what it uses up, it is left as it is.
    kept_one = state_delta(made_in, AbstractState("kitchen", ("stove",), ("meal", "obj2", "obj3 (sliced)"), ()))
    assert (
        on_the_task_items(kept_one, made_in, _recipe("obj1", "obj3"), ours, _recipe("obj2"), "prepare meal", COOKING)
        == kept_one
    )
    one = AbstractState("kitchen", (), ("obj1 (fried)", "obj2"), ())
    eating = state_delta(one, AbstractState("kitchen", (), ("obj2",), ()))
    assert on_the_task_items(eating, one, _recipe("obj1"), ours, _recipe("obj2", "obj3"), "eat obj1", COOKING) == eating
    # No task known, or the domain knows no task objects: as it is.
    assert on_the_task_items(change, made_in, None, ours, _recipe("obj2"), "prepare meal", COOKING) == change
    assert (
        on_the_task_items(change, made_in, _recipe("obj1", "obj3"), ours, _recipe("obj2"), "prepare meal", NO_RULES)
        == change
    )
