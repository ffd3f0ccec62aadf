"""Real-environment evaluation of a policy: play held-out games (or tasks), report success.

Every game is played `episodes_per_game` times in the real environment (`envs/real.py`: TextWorld
or ScienceWorld, by the games' files), in batches of episodes side by side through
`dreamgym.rl.rollout.play`, each batch slot with its own environment reused from batch to
batch. One `torch.Generator` seeded from `seed` drives every sampled action, so the same
policy, games, seed, batch size and step limit give the same report, also when sampling
(`greedy=False`). Greedy episodes of one game repeat exactly, so
`episodes_per_game > 1` only adds information when sampling.

Report (`EvaluationReport.summary`):

    episodes          games × episodes_per_game
    wins              episodes won
    success_rate      wins / episodes
    ci95              [lo, hi]: the Wilson score interval of the success rate (z = 1.96)
    mean_return       mean over episodes of the sum of the game's step rewards (score gained)
    mean_steps        mean episode length
    real_transitions  real-environment steps played (the sum of the episode lengths)
    outcomes          "1" for each episode won, "0" for each lost, in play order (games sorted,
                      then episodes): two policies measured on one evaluation set are compared
                      game by game (the promotion gate's paired test)

and one record per episode (`EvaluationReport.records`): game, task_id, episode, won,
truncated, return, steps, and the actions taken joined by " | ".

Launch: `dreamgym eval --policy models:/dreamgym-policy@champion --games data/games/test
--json outputs/eval/policy.json` (see `dreamgym eval --help`; `evaluate_reference` is its work).
`evaluate_held_out` and `write_report` are shared by that command, the pipeline's evaluation task
and the promotion gate, so that they play and write alike. An experience model is measured
against the real game on held-out games by `evaluate_experience_model` (`dreamgym experience
eval`), the measurement itself shared with the pipeline (`dreamgym.experience.report`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dreamgym.config import PipelineConfig, config_to_dict
from dreamgym.envs.real import env_for, list_games, load_task
from dreamgym.errors import DreamgymError
from dreamgym.policy.model import Policy
from dreamgym.rl.rollout import Episode, RealBudget, play

if TYPE_CHECKING:
    from dreamgym.experience.report import FidelityRun

EPISODE_COLUMNS = ("game", "task_id", "episode", "won", "truncated", "return", "steps", "actions")
ACTION_SEPARATOR = " | "
# Episodes played side by side. Greedy results depend on it only through the batches' float sums,
# so shards of one evaluation are cut at its multiples (dreamgym/ops/sharding.py).
BATCH = 16


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval for a success rate of `successes` out of `n` trials.

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or n successes
    (0/10 -> (0, 0.2775)). With no trials nothing is known: n = 0 gives (0.0, 1.0).
    """
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got {successes} successes of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denominator = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    # Clamped: at 0 or n successes the bound is exactly 0 or 1, up to rounding.
    return max(0.0, centre - half), min(1.0, centre + half)


def eval_set_id(game_names: Sequence[str], settings: dict, seed: int) -> str:
    """A short id of the frozen held-out evaluation set: the games, the settings and the seed.

    Two success counts are comparable (the promotion gate tests one against the other) only when
    measured on the same set; a policy's version records this id so that a later change of games,
    settings or seed is noticed instead of compared. The game order does not matter (sorted).
    """
    content = json.dumps({"games": sorted(game_names), "settings": settings, "seed": seed}, sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def held_out_games(config: PipelineConfig, games_dir: str | Path) -> list[Path]:
    """The frozen held-out set: `evaluation.games` (0: all) games of `games_dir` (the test split,
    `<data_dir>/games/test`), evenly spread over its sorted names.

    Not the first ones: names sort by the game's setting (`cooking-test-r1t1g1-...` first), so the
    first ones are mostly the easiest games, and a policy scored on them looked twice as good as on
    the whole split (measured: results log, 2026-11-25)."""
    games = list_games(games_dir)
    wanted = config.evaluation.games
    if not wanted or wanted >= len(games):
        return games
    return [games[index * len(games) // wanted] for index in range(wanted)]


def current_eval_set(config: PipelineConfig, games: list[Path]) -> str:
    """The `eval_set_id` of `games` under the config's evaluation settings and seed."""
    return eval_set_id([game.name for game in games], config_to_dict(config.evaluation), config.seed)


@dataclass(frozen=True)
class EvaluationReport:
    summary: dict
    records: list[dict]


def episode_record(game: Path, episode_index: int, episode: Episode) -> dict:
    """One row of the per-episode table."""
    return {
        "game": game.name,
        "task_id": episode.task.task_id,
        "episode": episode_index,
        "won": episode.won,
        "truncated": episode.truncated,
        "return": episode.episode_return("score"),
        "steps": episode.steps,
        "actions": ACTION_SEPARATOR.join(episode.actions),
    }


def summarize(records: Sequence[dict]) -> dict:
    """The report's figures from its per-episode records."""
    n = len(records)
    wins = sum(bool(record["won"]) for record in records)
    steps = sum(record["steps"] for record in records)
    lo, hi = wilson_interval(wins, n)
    return {
        "episodes": n,
        "wins": wins,
        "success_rate": wins / n if n else 0.0,
        "ci95": [lo, hi],
        "mean_return": sum(record["return"] for record in records) / n if n else 0.0,
        "mean_steps": steps / n if n else 0.0,
        "real_transitions": steps,
        "outcomes": "".join("1" if record["won"] else "0" for record in records),
    }


def evaluate_policy(
    policy: Policy,
    games: Sequence[str | Path],
    episodes_per_game: int,
    seed: int,
    max_steps: int,
    greedy: bool = True,
    batch: int = BATCH,
    progress: bool = True,
) -> EvaluationReport:
    """Play every game `episodes_per_game` times in the real game; see the module docstring.

    Sampled episodes depend on the batch size too (the batch's actions are drawn in turn from
    one generator): compare sampled evaluations run with the same `batch`.
    """
    from tqdm.auto import tqdm

    if episodes_per_game < 1 or batch < 1:
        raise ValueError(f"episodes_per_game and batch must be at least 1, got {episodes_per_game} and {batch}")
    games = [Path(game) for game in games]
    if not games:
        raise DreamgymError("no games to evaluate on; generate held-out games with `dreamgym games --split test`")
    plan = [(game, load_task(game), index) for game in games for index in range(episodes_per_game)]
    generator = torch.Generator().manual_seed(seed)
    envs = [env_for(games, max_steps) for _ in range(min(batch, len(plan)))]
    records = []
    was_training = policy.training
    policy.eval()
    try:
        with tqdm(total=len(plan), desc="policy eval", unit="episode", disable=not progress) as bar:
            for start in range(0, len(plan), batch):
                chunk = plan[start : start + batch]
                played = play(
                    policy,
                    envs[: len(chunk)],
                    [task for _, task, _ in chunk],
                    greedy=greedy,
                    generator=generator,
                    budget=RealBudget(None),
                )
                records += [
                    episode_record(game, index, episode)
                    for (game, _, index), episode in zip(chunk, played, strict=True)
                ]
                bar.update(len(chunk))
    finally:
        policy.train(was_training)
        for env in envs:
            env.close()
    return EvaluationReport(summarize(records), records)


def evaluate_held_out(policy: Policy, games: Sequence[str | Path], config: PipelineConfig) -> EvaluationReport:
    """`evaluate_policy` with the config's evaluation settings and seed: how `dreamgym eval`, the
    pipeline's evaluation task and the promotion gate play a policy, kept in one place so that
    their figures stay comparable."""
    settings = config.evaluation
    return evaluate_policy(
        policy, games, settings.episodes_per_game, config.seed, settings.max_steps, greedy=settings.greedy
    )


def episodes_path(json_path: str | Path) -> Path:
    """Where the per-episode table of a report written to `json_path` goes: `x.json` -> `x.episodes.csv`."""
    return Path(json_path).with_suffix(".episodes.csv")


def write_json(values: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values, indent=2) + "\n")
    return path


def write_episodes(records: Sequence[dict], path: str | Path) -> Path:
    """The per-episode table as CSV (one row per episode, `EPISODE_COLUMNS`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=EPISODE_COLUMNS)
        writer.writeheader()
        writer.writerows(records)
    return path


def write_report(report: EvaluationReport, path: str | Path, header: dict) -> dict:
    """Write a report's two files: the per-episode table (`episodes_path`), then `path`, JSON of
    `header` followed by the summary (written last: a JSON present means a whole report). Returns
    what the JSON holds. The pipeline and `dreamgym eval` write their reports with it."""
    values = {**header, **report.summary}
    write_episodes(report.records, episodes_path(path))
    write_json(values, path)
    return values


def evaluation_metrics(summary: dict, prefix: str = "eval_") -> dict[str, float]:
    """The summary as flat MLflow metrics (ci95 as `ci95_low` / `ci95_high`)."""
    lo, hi = summary["ci95"]
    metrics = {key: float(value) for key, value in summary.items() if isinstance(value, int | float)}
    return {f"{prefix}{key}": value for key, value in {**metrics, "ci95_low": lo, "ci95_high": hi}.items()}


def log_evaluation(report: EvaluationReport, json_path: str | Path, prefix: str = "eval_") -> None:
    """Log the report's metrics and its two files, already written (`json_path` and the table
    beside it, `episodes_path`), to the active MLflow run under `evaluation/`."""
    import mlflow

    mlflow.log_metrics(evaluation_metrics(report.summary, prefix))
    mlflow.log_artifact(str(json_path), artifact_path="evaluation")
    mlflow.log_artifact(str(episodes_path(json_path)), artifact_path="evaluation")


# --- the commands' work -------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyEvaluation:
    """What `evaluate_reference` measured: the policy's label, the games played, the summary
    (`EvaluationReport.summary`) and where the report was written."""

    label: str
    games: int
    summary: dict
    json_path: Path

    def describe(self) -> str:
        """The line `dreamgym eval` prints."""
        summary = self.summary
        lo, hi = summary["ci95"]
        return (
            f"{self.label}: success {summary['success_rate']:.1%} (95% CI {lo:.1%}-{hi:.1%}) over "
            f"{summary['episodes']} episodes on {self.games} games, mean return "
            f"{summary['mean_return']:.2f}, mean steps {summary['mean_steps']:.1f}, "
            f"{summary['real_transitions']} real transitions → {self.json_path}"
        )


def evaluate_reference(
    policy: str, games_dir: Path, json_out: Path, config: PipelineConfig, project: Path
) -> PolicyEvaluation:
    """`dreamgym eval`: play the policy `policy` names (a folder or a registry reference) on the
    held-out games of `games_dir`, in a `policy-eval` MLflow run that logs the report written to
    `json_out` (and its per-episode table). Bad input (no games, no such policy folder, a damaged
    game) is reported before the run is opened."""
    from dreamgym.ops.registry import resolve_model
    from dreamgym.ops.tracking import configure_services, stage_run
    from dreamgym.policy.model import load_policy

    settings = config.evaluation
    run_dir = project / config.paths.run_dir
    game_files = held_out_games(config, games_dir)
    if not policy.startswith("models:/") and "/" in policy and not Path(policy).is_dir():  # a path, not a name
        raise DreamgymError(
            f"--policy {policy}: no such folder; train a policy first (`dreamgym run`) or "
            "give a registered one, e.g. models:/dreamgym-policy@champion"
        )
    for game in game_files:  # a damaged game is reported before a run is opened, not as a FAILED run
        load_task(game)
    configure_services(run_dir)
    policy_dir, label = resolve_model(policy, run_dir / "models")
    agent = load_policy(policy_dir, config.policy)
    tags = {"dreamgym.policy": label, "dreamgym.eval_games": str(games_dir.resolve())}
    eval_params = {
        "games": len(game_files),
        "episodes_per_game": settings.episodes_per_game,
        "seed": config.seed,
        "max_steps": settings.max_steps,
        "greedy": settings.greedy,
    }
    header = {
        "policy": label,
        "games": len(game_files),
        "seed": config.seed,
        "episodes_per_game": settings.episodes_per_game,
        "max_steps": settings.max_steps,
        "greedy": settings.greedy,
    }
    with stage_run("policy-eval", config, project, tags=tags, params=eval_params):
        report = evaluate_held_out(agent, game_files, config)
        write_report(report, json_out, header)
        log_evaluation(report, json_out)
    return PolicyEvaluation(label, len(game_files), report.summary, json_out)


def evaluate_experience_model(
    model: str, games_dir: Path, json_out: Path, config: PipelineConfig, project: Path, no_model: bool = False
) -> FidelityRun:
    """`dreamgym experience eval`: the fidelity of the experience model `model` names (or, with
    `no_model`, of its prompts' top neighbour copied) on real transitions collected on the
    held-out games of `games_dir`, in an `experience-eval` MLflow run; the summary is written to
    `json_out`. Lives here, not in `dreamgym.experience`, because it plays the real games."""
    from dreamgym.data.collect import collect_held_out
    from dreamgym.envs.real import task_setting
    from dreamgym.experience.report import FidelityRun, measure_fidelity
    from dreamgym.ops.registry import resolve_model
    from dreamgym.ops.tracking import configure_services, stage_run

    run_dir = project / config.paths.run_dir
    if not games_dir.is_dir():
        raise DreamgymError(
            f"--games {games_dir}: no such folder; make held-out games with `dreamgym games --split test`"
        )
    configure_services(run_dir)
    model_dir, label = resolve_model(model, run_dir / "models")
    out = project / config.paths.outputs_dir / "experience" / f"eval-{games_dir.resolve().name}.parquet"
    real = collect_held_out(games_dir, out, config)
    tags = {
        "dreamgym.model": label,
        "dreamgym.eval_games": str(games_dir.resolve()),
        "dreamgym.no_model": str(no_model),
    }
    with stage_run("experience-eval", config, project, tags=tags):
        summary = measure_fidelity(model_dir, real, run_dir, config, copy_neighbours=no_model, setting_of=task_setting)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps({"model": label, "no_model": no_model, **summary}, indent=2))
    return FidelityRun(summary, json_out)
