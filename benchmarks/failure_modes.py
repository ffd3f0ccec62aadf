"""How each policy loses its games: the last step of every lost episode, judged against the recipe
(a measurement, not a test; TextWorld cooking games). `--games` may be given more than once.

    .venv/bin/python benchmarks/failure_modes.py --games bench/games-headroom-s131 \
        outputs/policy/eval-bc-<key>.episodes.csv outputs/policy/eval-dreamgym-<key>.episodes.csv \
        [--json benchmarks/results/failure-modes-<date>.json]

A tw-cooking game is lost by its last action: a cook with an appliance the recipe does not ask
for (to grill is the BBQ's, to roast the oven's, to fry the stove's), a cook or a cut of an item
already cooked or cut, a cut the recipe does not ask for, eating an ingredient, or the steps run
out. Each file is an evaluation's episode table (`evaluate-policy` writes one beside its report);
the first is the reference: for every other, the episodes it wins that the first loses (the same
game and episode index), those it loses that the first wins, and how it lost those.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import Counter
from pathlib import Path

from common import machine

from dreamgym.envs.real import list_games, load_task
from dreamgym.envs.textworld.cooking import TextWorldCooking, direction_of

COOKING = TextWorldCooking()


def ending(actions: list[str], won: bool, truncated: bool, instruction: str) -> str:
    """How the episode ended, judged against the recipe in `instruction`."""
    if won:
        return "won"
    if truncated or not actions:
        return "out of steps"
    last = actions[-1]
    if last.split()[0] == "eat":
        return "eat: the meal" if last == "eat meal" else "eat: an ingredient"
    carried = direction_of(last)  # (verb, item, family) of a cook or a cut
    if carried is None:
        return f"other: {last.split()[0]}"
    verb, item, family = carried
    kind = "cook" if last.startswith("cook ") else "cut"
    directions = COOKING.directions(instruction)
    asked = [wanted for wanted, name, its_family in directions if name == item and its_family is family]
    if not asked:
        in_recipe = any(name == item for _, name, _ in directions)
        return f"{kind}: the recipe does not {kind} it" if in_recipe else f"{kind}: not an ingredient"
    if asked[0] != verb:
        return f"cook: the wrong appliance to {asked[0]}" if kind == "cook" else "cut: the wrong cut"
    done_before = any((earlier := direction_of(action)) and earlier[1:] == (item, family) for action in actions[:-1])
    return f"{kind}: {'again' if done_before else 'as asked, yet lost'}"


def endings(path: Path, instructions: dict[str, str]) -> dict[tuple[str, str], str]:
    """The ending of each episode (game, episode index) of one episode table."""
    result = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["game"] not in instructions:
                raise SystemExit(f"{path}: game {row['game']} is in none of the --games folders; add its folder")
            actions = row["actions"].split(" | ") if row["actions"] else []
            won, truncated = row["won"] == "True", row["truncated"] == "True"
            result[row["game"], row["episode"]] = ending(actions, won, truncated, instructions[row["game"]])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tables", nargs="+", type=Path, help="eval-*.episodes.csv files; the first is the reference")
    parser.add_argument("--games", action="append", required=True, help="a folder of the tables' games (repeatable)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    instructions = {game.name: load_task(game).instruction for folder in args.games for game in list_games(folder)}
    by_table = {path: endings(path, instructions) for path in args.tables}
    reference = by_table[args.tables[0]]
    report: dict = {"machine": machine(), "games": args.games, "tables": {}}
    for path, ended in by_table.items():
        counts = Counter(ended.values())
        entry: dict = {"episodes": len(ended), "wins": counts["won"], "endings": dict(counts.most_common())}
        print(f"{path.name}: {counts['won']} of {len(ended)} episodes won")
        for how, count in counts.most_common():
            if how != "won":
                print(f"    {count:4d}  {how}")
        if path != args.tables[0]:
            shared = ended.keys() & reference.keys()
            gained = [key for key in shared if ended[key] == "won" != reference[key]]
            lost = [key for key in shared if reference[key] == "won" != ended[key]]
            lost_by = dict(Counter(ended[key] for key in lost).most_common())
            entry["against_reference"] = {"gained": len(gained), "lost": len(lost), "lost_by": lost_by}
            print(f"    against {args.tables[0].name}: +{len(gained)} -{len(lost)}, lost by {lost_by}")
        report["tables"][str(path)] = entry
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
