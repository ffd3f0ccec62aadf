"""Generate TextWorld cooking games as `tw-make tw-cooking` makes them, in parallel and reproducibly.

Game i of a split gets the seed `seed * 100_000 + i` and draws its difficulty (recipe size,
ingredients to find, rooms) from the lists in `GamesConfig` with that seed, so a seed always gives
the same games. The file name spells out every setting, so a game made with other settings is
never mistaken for this one, and a game that already exists is not made again. Each game is
compiled in a temporary folder and moved into place only when complete: a killed run never
leaves half a game behind.

Each worker is one child process (`python -m dreamgym.envs.textworld.make_games`) that makes its
share of the games one after another with tw-make's own argument parser and TextWorld's API, the
same bytes as one `tw-make` process per game (tested): importing TextWorld and parsing its grammar
and game logic, two thirds of a `tw-make` run (~6 of ~9 s on this machine), are then paid once per
worker rather than once per game. The child runs with PYTHONHASHSEED=0, as `tw-make` did, because
TextWorld writes set-ordered lists into a game's JSON. The story's serial number, the day Inform
compiled it, is set to a constant: a seed gives the same bytes on any day as on any machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.machinery
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from dreamgym.envs.textworld.config import GAME_SEED_STRIDE, MAX_SEED, SPLITS, GamesConfig
from dreamgym.envs.textworld.env import check_game_file
from dreamgym.errors import DreamgymError

GAME_SUFFIXES = (".z8", ".json", ".ni")
# Inform writes the compile date (YYMMDD) into a story's header as its serial number, so the same
# seed gave other bytes on another day (and DVC saw a changed game). Every game gets this one.
STORY_SERIAL = b"000000"
_SERIAL_AT = slice(0x12, 0x18)  # the Z-machine header's serial number; the checksum starts at 0x40
SEED_STRIDE = GAME_SEED_STRIDE


# The headroom benchmark (`games.target: headroom`): recipes of 2-3 ingredients, 2-3 of them to
# find, in 6 or 9 rooms, with opening, cooking and cutting. BC trained on the default games (recipes
# of 1-2, 1 or 6 rooms) wins some of them, all recipe-2, 6-room ones, so RL has room to improve and
# something to start from; recipes of 3 alone, tried first, it nearly never won (measured: results
# log, 2026-12-02). A game's file name spells its settings, so these games never
# mix with others; changing the preset makes new games, not changed ones.
HEADROOM = {"recipe": (2, 3), "take": (2, 3), "go": (6, 9)}


def target_settings(config: GamesConfig) -> GamesConfig:
    """The settings of the games RL practises and the gate measures (`games.target`)."""
    if config.target == "headroom":
        return dataclasses.replace(config, **HEADROOM)
    return config


def target_folder(split_folder: str, config: GamesConfig) -> str:
    """The folder name of the target's games of a kind (`test`, `tasks`): `test` for the training
    settings, `test-headroom` for the preset."""
    return split_folder if config.target == "same" else f"{split_folder}-{config.target}"


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


_NAME = re.compile(r"cooking-(\w+)-r(\d+)t(\d+)g(\d+)(?:-([okc]+))?-s(\d+)")
_FLAGS = {"o": "open", "k": "cook", "c": "cut"}


def spec_of(task_id: str) -> GameSpec | None:
    """The spec a game was made from, read back from its name (`GameSpec.name`); None for a game
    not named so."""
    match = _NAME.fullmatch(task_id)
    if match is None:
        return None
    split, recipe, take, go, flags, seed = match.groups()
    flags = flags or ""
    return GameSpec(split, int(seed), int(recipe), int(take), int(go), "o" in flags, "k" in flags, "c" in flags)


def game_setting(task_id: str) -> str:
    """The tw-cooking settings a game was made with, read from its name (`GameSpec.name`):
    "recipe 2, take 1, rooms 6, open/cook/cut"; "other" for a game not named so."""
    spec = spec_of(task_id)
    if spec is None:
        return "other"
    label = f"recipe {spec.recipe}, take {spec.take}, rooms {spec.go}"
    flags = [_FLAGS[flag] for flag, on in (("o", spec.open), ("k", spec.cook), ("c", spec.cut)) if on]
    return label + (", " + "/".join(flags) if flags else "")


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise DreamgymError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    return split


def plan_games(config: GamesConfig, split: str, count: int, seed: int, first: int = 0) -> list[GameSpec]:
    """The specs of games first..first+count-1 of a split: deterministic for (config, split, count,
    seed, first); game i is the same whatever `first` and `count` take it in."""
    check_split(split)
    if first < 0 or count < 0 or first + count > SEED_STRIDE:
        raise DreamgymError(
            f"games {first}..{first + count - 1} are out of range: a seed has games 0 to {SEED_STRIDE - 1}"
        )
    if not 0 <= seed <= MAX_SEED:
        raise DreamgymError(
            f"seed {seed} is out of range: use 0 to {MAX_SEED} (game i gets seed * "
            f"{SEED_STRIDE} + i, and tw-make takes seeds below 2**32)"
        )
    specs = []
    for index in range(first, first + count):
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


def tw_make_parser() -> argparse.ArgumentParser:
    """tw-make's own argument parser (loaded from its script: what it records of its arguments in
    a game's JSON is part of the game)."""
    loader = importlib.machinery.SourceFileLoader("dreamgym_tw_make", _tw_make())
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module.build_parser(default_parser_only=True)


def compile_in_process(spec: GameSpec, output: Path, parser: argparse.ArgumentParser) -> None:
    """Make and compile one game to `output`, as the tw-make command line does for a challenge."""
    import textworld
    import textworld.challenges
    import textworld.generator

    args = parser.parse_args(spec.tw_make_args(output))
    options = textworld.GameOptions()
    options.seeds = args.seed
    options.path = str(Path(args.output).resolve())
    options.file_ext = f".{args.format}"
    options.force_recompile = args.force
    _, make, _ = textworld.challenges.CHALLENGES[args.subcommand]
    textworld.generator.compile_game(make(settings=vars(args), options=options), options)


def fix_serial(story: Path) -> None:
    """Overwrite the compile date in a Z-machine story's header with `STORY_SERIAL`, once the
    story passes the checks a game is played with (`check_game_file`)."""
    data = bytearray(check_game_file(story).read_bytes())
    data[_SERIAL_AT] = STORY_SERIAL
    story.write_bytes(bytes(data))


def make_game(spec: GameSpec, out_dir: Path, parser: argparse.ArgumentParser) -> Path:
    """Compile one game into `out_dir` (atomically); return its `.z8` path. In a process started
    with PYTHONHASHSEED=0 (`make_games`)."""
    target = out_dir / f"{spec.name}.z8"
    with tempfile.TemporaryDirectory(prefix=".tw-make-", dir=out_dir) as scratch:
        output = Path(scratch) / target.name
        try:
            compile_in_process(spec, output, parser)
        except Exception as error:  # TextWorld's own errors, e.g. no quest for these settings
            raise GameGenerationError(f"{type(error).__name__}: {error}") from error
        fix_serial(output)
        metadata_file = output.with_suffix(".json")
        metadata_file.write_text(json.dumps(_portable(json.loads(metadata_file.read_text()), target)))
        # The JSON goes last: a game counts as present only once its .z8 and .json both exist.
        for suffix in (".ni", ".z8", ".json"):
            produced = output.with_suffix(suffix)
            if produced.exists():
                produced.replace(target.with_suffix(suffix))
    return target


_MADE = "made "


def make_games(
    specs: Sequence[GameSpec], out_dir: str | Path, on_made: Callable[[Path], None] | None = None
) -> list[Path]:
    """Make `specs` into `out_dir` one after another in one child process; `on_made` hears of
    each game as it is done. A failure names the game and TextWorld's error."""
    if not specs:
        return []
    command = [sys.executable, "-m", "dreamgym.envs.textworld.make_games", str(out_dir)]
    payload = json.dumps([dataclasses.asdict(spec) for spec in specs])
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    made, last_said = [], ""
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as child:
        child.stdin.write(payload)
        child.stdin.close()
        for line in child.stdout:
            if line.startswith(_MADE):
                made.append(Path(line[len(_MADE) :].strip()))
                if on_made is not None:
                    on_made(made[-1])
            elif line.strip():
                last_said = line.strip()
    if child.returncode != 0 or len(made) != len(specs):
        reason = last_said or f"exit status {child.returncode}, no output"
        reason = reason.split(f"{GameGenerationError.__name__}: ", 1)[-1]  # the child's traceback's last line
        raise GameGenerationError(f"tw-make failed for {specs[min(len(made), len(specs) - 1)].name}: {reason}")
    return made


def make_games_here(out_dir: str) -> None:
    """The child of `make_games`: specs as JSON on stdin, `made <path>` on stdout per game."""
    parser = tw_make_parser()
    for fields in json.load(sys.stdin):
        print(_MADE + str(make_game(GameSpec(**fields), Path(out_dir), parser)), flush=True)


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
        shares = [todo[worker::workers] for worker in range(min(workers, len(todo)))]
        with (
            ThreadPoolExecutor(max_workers=len(shares)) as pool,
            tqdm(total=len(todo), desc=f"games → {out_dir}", unit="game", disable=not progress) as bar,
        ):
            futures = [pool.submit(make_games, share, out_dir, lambda _: bar.update()) for share in shares]
            for future in as_completed(futures):
                future.result()
    return paths, len(todo)
