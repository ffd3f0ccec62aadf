import pytest

from dreamgym.state import AbstractState, StateParseError, format_state, item_name, parse_state

STATE = AbstractState(
    location="kitchen",
    visible=("table", "knife (on table)", "fridge (open)", "red apple (sliced, in fridge)"),
    inventory=("cookbook",),
    actions=("take knife from table", "close fridge", "go north"),
)


def test_format_is_sorted_and_round_trips():
    text = format_state(STATE)
    assert text.splitlines() == [
        "location: kitchen",
        "visible: fridge (open); knife (on table); red apple (sliced, in fridge); table",
        "inventory: cookbook",
        "actions: close fridge; go north; take knife from table",
    ]
    assert parse_state(text) == STATE
    assert parse_state(text).to_text() == text


def test_empty_fields_round_trip():
    empty = AbstractState(location="hall")
    assert format_state(empty) == "location: hall\nvisible:\ninventory:\nactions:"
    assert parse_state(format_state(empty)) == empty


@pytest.mark.parametrize(
    "text, problem",
    [
        ("location: kitchen\nvisible:\ninventory:", "expected 4 lines"),
        ("place: kitchen\nvisible:\ninventory:\nactions:", "'location:'"),
        ("location:\nvisible:\ninventory:\nactions:", "location is empty"),
        ("location: k\nvisible: b; a\ninventory:\nactions:", "not sorted"),
        ("location: k\nvisible: a; a\ninventory:\nactions:", "repeated"),
        ("location: k\nvisible:a\ninventory:\nactions:", "missing space"),
        ("location: k\nvisible: a;  b\ninventory:\nactions:", "surrounding spaces"),
    ],
)
def test_parser_rejects_malformed_text_with_the_reason(text, problem):
    with pytest.raises(StateParseError, match=problem):
        parse_state(text)


def test_items_cannot_break_the_format():
    with pytest.raises(StateParseError, match="contains ';'"):
        AbstractState(location="k", inventory=("a; b",))


@pytest.mark.parametrize(
    "item",
    [
        "examine fridge)",
        "obj2 (on counter) to the inventory",
        "+examine counter",
        "-knife",
        "knife (a) (b)",
        "(open)",
        "carrot (in fridge +onion from fridge)",  # two entries of a change run into one
        "take carrot from fridge +take onion from fridge",
    ],
)
def test_an_item_is_a_name_and_its_descriptors_and_nothing_else(item):
    with pytest.raises(StateParseError, match="is not 'name' or 'name \\(descriptors\\)'"):
        AbstractState(location="k", visible=(item,))
    with pytest.raises(StateParseError, match="is not 'name'"):
        parse_state(f"location: k\nvisible: {item}\ninventory:\nactions:")
    for fine in ("frosted-glass door (closed)", "red apple (sliced, in fridge)", "a", "go north"):
        assert AbstractState(location="k", visible=(fine,)).visible == (fine,)


def test_item_name_drops_descriptors():
    assert item_name("red apple (sliced, in fridge)") == "red apple"
    assert item_name("table") == "table"
