"""The first mistake of each lost episode, read against the game's recipe, from the per-episode
table `dreamgym eval` writes beside its report; and the wins by the recipe's number of ingredients.

    .venv/bin/dreamgym eval --policy <model> --games <games> --json <report>.json
    .venv/bin/python benchmarks/recipe_mistakes.py <games> <report>.episodes.csv [...]

A cooking or cutting move is checked against the recipe's directions as the domain reads them
(`experience/cooking.py`: `fry` = cook with the stove, `slice` = slice with the knife, ...); a cut
that the recipe asks of the *other* ingredient is counted apart: it is the policy reading the wrong
clause. Unlike benchmarks/policy_failures.py this replays nothing: it reads what the evaluation
played. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import Counter
from pathlib import Path

from dreamgym.envs.textworld_env import load_task
from dreamgym.experience.cooking import TextWorldCooking, direction_of

COOKING = TextWorldCooking()


def recipe(game: Path) -> dict[str, set[str]]:
    """Each ingredient of the game's recipe, with the verbs its directions ask of it."""
    instruction = load_task(game).instruction
    needs = {item: set() for item in COOKING.task_objects(instruction)}
    for verb, item, _ in COOKING.directions(instruction):
        needs[item].add(verb)
    return needs


def first_mistake(actions: list[str], needs: dict[str, set[str]], truncated: bool) -> str:
    for action in actions:
        if carried := direction_of(action):
            verb, item, family = carried
            cooks = family[verb].startswith("cook ")
            if item not in needs:
                return "cooks what the recipe does not list" if cooks else "cuts what the recipe does not list"
            if verb not in needs[item]:
                if cooks:
                    return "wrong cooking"
                others = [name for name, verbs in needs.items() if name != item and verb in verbs]
                return "the other ingredient's cut" if others else "wrong cut"
        if action.startswith("eat ") and action != "eat meal":
            return "eats an ingredient"
    return "ran out of steps" if truncated else "other"


def summarise(games: Path, table: Path) -> dict:
    rows = list(csv.DictReader(table.open()))
    played, won, mistakes = Counter(), Counter(), Counter()
    for row in rows:
        needs = recipe(games / Path(row["game"]).name)
        played[len(needs)] += 1
        if row["won"] == "True":
            won[len(needs)] += 1
        else:
            mistakes[first_mistake(row["actions"].split(" | "), needs, row["truncated"] == "True")] += 1
    return {
        "table": str(table),
        "won": sum(won.values()),
        "episodes": len(rows),
        "won_by_ingredients": {n: f"{won[n]}/{played[n]}" for n in sorted(played)},
        "first_mistakes": dict(mistakes.most_common()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("games", type=Path, help="the folder of games the evaluation played")
    parser.add_argument("tables", type=Path, nargs="+", help="<report>.episodes.csv of `dreamgym eval`")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    summaries = [summarise(args.games, table) for table in args.tables]
    for summary in summaries:
        won = f"{summary['won']}/{summary['episodes']} won"
        print(f"{summary['table']}: {won}; by ingredients {summary['won_by_ingredients']}")
        for mistake, count in summary["first_mistakes"].items():
            print(f"  {count:4d}  {mistake}")
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=2) + "\n")


if __name__ == "__main__":
    main()
