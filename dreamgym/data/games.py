"""Generate TextWorld cooking games with `tw-make tw-cooking`, in parallel and reproducibly.

Game i of a split gets the seed `seed * 100_000 + i` and draws its difficulty (recipe size,
ingredients to find, rooms) from the lists in `GamesConfig` with that seed, so a seed always gives
the same games. The file name spells out every setting, so a game made with other settings is
never mistaken for this one, and a game that already exists is not made again. Each game is
compiled in a temporary folder and moved into place only when complete: a killed run never
leaves half a game behind.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from dreamgym.config import GAME_SEED_STRIDE, MAX_SEED, SPLITS, GamesConfig
from dreamgym.envs.textworld_env import check_game_file
from dreamgym.errors import DreamgymError

GAME_SUFFIXES = (".z8", ".json", ".ni")
SEED_STRIDE = GAME_SEED_STRIDE


class GameGenerationError(DreamgymError):
    """tw-make failed or is not installed."""


@dataclass(frozen=True)
class GameSpec:
    """Everything that determines one generated game."""

    split: str
    seed: int
    recipe: int
    take: int
    go: int
    open: bool
    cook: bool
    cut: bool

    @property
    def name(self) -> str:
        flags = "".join(flag for flag, on in (("o", self.open), ("k", self.cook), ("c", self.cut)) if on)
        return f"cooking-{self.split}-r{self.recipe}t{self.take}g{self.go}{'-' + flags if flags else ''}-s{self.seed}"

    def tw_make_args(self, output: Path) -> list[str]:
        args = [
            "tw-cooking",
            "--recipe",
            str(self.recipe),
            "--take",
            str(self.take),
            "--go",
            str(self.go),
            "--split",
            self.split,
            "--seed",
            str(self.seed),
            "--output",
            str(output),
            "--silent",
            "-f",
        ]
        args += [f"--{flag}" for flag, on in (("open", self.open), ("cook", self.cook), ("cut", self.cut)) if on]
        return args


_NAME = re.compile(r"cooking-\w+-r(\d+)t(\d+)g(\d+)(?:-([okc]+))?-s\d+")
_FLAGS = {"o": "open", "k": "cook", "c": "cut"}


def game_setting(task_id: str) -> str:
    """The tw-cooking settings a game was made with, read from its name (`GameSpec.name`):
    "recipe 2, take 1, rooms 6, open/cook/cut"; "other" for a game not named so."""
    match = _NAME.fullmatch(task_id)
    if match is None:
        return "other"
    recipe, take, go, flags = match.groups()
    label = f"recipe {recipe}, take {take}, rooms {go}"
    return label + (", " + "/".join(_FLAGS[flag] for flag in flags) if flags else "")


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise DreamgymError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    return split


def plan_games(config: GamesConfig, split: str, count: int, seed: int) -> list[GameSpec]:
    """The specs of games 0..count-1 of a split: deterministic for (config, split, count, seed)."""
    check_split(split)
    if not 0 <= count <= SEED_STRIDE:
        raise DreamgymError(f"game count must be 0 to {SEED_STRIDE}, got {count}")
    if not 0 <= seed <= MAX_SEED:
        raise DreamgymError(
            f"seed {seed} is out of range: use 0 to {MAX_SEED} (game i gets seed * "
            f"{SEED_STRIDE} + i, and tw-make takes seeds below 2**32)"
        )
    specs = []
    for index in range(count):
        game_seed = seed * SEED_STRIDE + index
        rng = random.Random(game_seed)
        recipe = rng.choice(config.recipe)
        take = min(rng.choice(config.take), recipe)
        go = rng.choice(config.go)
        specs.append(
            GameSpec(
                split=split,
                seed=game_seed,
                recipe=recipe,
                take=take,
                go=go,
                open=config.open,
                cook=config.cook,
                cut=config.cut,
            )
        )
    return specs


def _tw_make() -> str:
    beside_python = Path(sys.executable).with_name("tw-make")
    found = str(beside_python) if beside_python.exists() else shutil.which("tw-make")
    if not found:
        raise GameGenerationError("tw-make not found; install TextWorld (`pip install textworld`)")
    return found


def _portable(game: dict, target: Path) -> dict:
    """tw-make records where it wrote the game and where TextWorld is installed; keep the final
    file name and the grammar path relative to TextWorld's package, so that the same seed gives a
    byte-identical game on any machine. (Playing never reads the grammar path.)"""
    import textworld  # installed with the project; slow to import

    game.get("metadata", {}).get("settings", {})["output"] = target.name
    knowledge = game.get("KB", {})
    grammars = knowledge.get("text_grammars_path")
    packages = Path(textworld.__file__).resolve().parent.parent
    if grammars and Path(grammars).resolve().is_relative_to(packages):
        knowledge["text_grammars_path"] = Path(grammars).resolve().relative_to(packages).as_posix()
    return game


def make_game(spec: GameSpec, out_dir: Path) -> Path:
    """Compile one game into `out_dir` (atomically); return its `.z8` path."""
    target = out_dir / f"{spec.name}.z8"
    with tempfile.TemporaryDirectory(prefix=".tw-make-", dir=out_dir) as scratch:
        output = Path(scratch) / target.name
        # tw-make writes set-ordered lists into the game's JSON; a fixed hash seed makes the
        # whole game (not only the story file) identical for a given seed.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(
            [_tw_make(), *spec.tw_make_args(output)], capture_output=True, text=True, env=env, check=False
        )
        if done.returncode != 0 or not output.exists():
            detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise GameGenerationError(f"tw-make failed for {spec.name}: {detail[0]}")
        metadata_file = output.with_suffix(".json")
        metadata_file.write_text(json.dumps(_portable(json.loads(metadata_file.read_text()), target)))
        # The JSON goes last: a game counts as present only once its .z8 and .json both exist.
        for suffix in (".ni", ".z8", ".json"):
            produced = output.with_suffix(suffix)
            if produced.exists():
                produced.replace(target.with_suffix(suffix))
    return target


def is_complete(game: Path) -> bool:
    try:
        check_game_file(game)
    except DreamgymError:
        return False
    return True


def generate_games(
    specs: Iterable[GameSpec], out_dir: str | Path, workers: int = 2, progress: bool = True
) -> tuple[list[Path], int]:
    """Make every game of `specs` that is not already in `out_dir`.

    Returns the paths of all the specs' games (in spec order) and how many were made now.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = list(specs)
    paths = [out_dir / f"{spec.name}.z8" for spec in specs]
    todo = [spec for spec, path in zip(specs, paths) if not is_complete(path)]
    if todo:
        with (
            ThreadPoolExecutor(max_workers=workers) as pool,
            tqdm(total=len(todo), desc=f"games → {out_dir}", unit="game", disable=not progress) as bar,
        ):
            futures = [pool.submit(make_game, spec, out_dir) for spec in todo]
            for future in as_completed(futures):
                future.result()
                bar.update()
    return paths, len(todo)


def list_games(games_dir: str | Path) -> list[Path]:
    """The complete `.z8` games in a folder, sorted; an error if there are none."""
    games_dir = Path(games_dir)
    if not games_dir.is_dir():
        raise DreamgymError(f"games folder {games_dir} does not exist; generate games with `dreamgym games --out DIR`")
    games = sorted(games_dir.glob("*.z8"))
    if not games:
        raise DreamgymError(f"no .z8 games in {games_dir}; generate games with `dreamgym games`")
    return games
