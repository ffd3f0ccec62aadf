"""Policy flow: behaviour cloning → RL (in DreamEnv with the curriculum, or the real game) →
optional sim-to-real → evaluation on the real held-out games → register `dreamgym-policy`.

Takes what the ingest and experience flows returned (`IngestResult`, `ExperienceResult`: IDs and
paths, not objects). The untrained policy (BC's starting point), the BC policy and the RL policy
are evaluated alike on the same test-split games, so the summary compares them. Every stage
writes into a folder named by what it depends on, so a re-run reuses finished work and a killed
RL run resumes from its last epoch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import mlflow
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from dreamgym.config import PipelineConfig, config_to_dict
from dreamgym.curriculum import Curriculum, WriteVariations
from dreamgym.data.schema import read_transitions
from dreamgym.envs.dream_env import DreamEnv
from dreamgym.envs.real import env_for, games_if_any, list_games, load_task, tasks_at_start
from dreamgym.envs.recall import RecallingDynamics
from dreamgym.envs.scienceworld.tasks import unseen_variation_writer
from dreamgym.envs.textworld.harder_games import harder_game_writer
from dreamgym.evaluation import (
    current_eval_set,
    episodes_path,
    evaluate_held_out,
    evaluation_metrics,
    held_out_games,
    write_report,
)
from dreamgym.experience.variations import dream_curriculum, seed_tasks
from dreamgym.ops.fanout import evaluate_in_pieces
from dreamgym.ops.promotion import POLICY_MODEL_NAME as MODEL_NAME
from dreamgym.ops.promotion import evaluation_tags, set_challenger
from dreamgym.ops.registry import register_model_dir
from dreamgym.ops.tracking import stage_run
from dreamgym.policy.bc import bc_examples, initial_policy, policy_kept_names, train_bc
from dreamgym.policy.model import load_policy
from dreamgym.policy.report import plot_learning_curves, plot_success
from dreamgym.rl.config import RLConfig
from dreamgym.rl.loop import RLResult, train_rl
from dreamgym.rl.monitor import RealCheck
from flows.caching import Stages, stage_key
from flows.compute import fanout
from flows.ingest import IngestResult, log_dataset, markdown_table
from flows.train_experience import ExperienceResult


@dataclass(frozen=True)
class WarmStart:
    """The behaviour-cloning stage: the untrained policy (its starting point) and the BC policy."""

    untrained: str
    bc: str
    examples: int
    steps: int
    seconds: float
    reused: bool


@dataclass(frozen=True)
class RLSummary:
    """The RL stage as the summary shows it (the full record is the run folder's RLResult)."""

    algorithm: str
    env: str
    epochs: int
    history: list[dict]  # one row of metrics per epoch
    real_transitions: int  # RL's and sim-to-real's together
    synthetic_transitions: int
    seconds: float
    s2r_seconds: float
    reused: bool
    recalled_transitions: int = 0  # of the synthetic ones, answered with a recorded real outcome (rl.recall_real)


@dataclass(frozen=True)
class PolicyResult:
    """What the policy flow made: the policy (a registry reference, or its folder when not
    registered) and each policy's evaluation (`evaluate_task`'s summaries: held-out games, and
    the training games when `evaluation.train_games` is set)."""

    mlflow_run_id: str
    model: str
    bc: WarmStart
    bc_model: str | None  # the BC policy's registry reference (the first champion), None when not registered
    rl: RLSummary
    evaluations: list[dict]
    train_evaluations: list[dict]
    same_settings_evaluations: list[dict] = dataclasses.field(default_factory=list)  # games.target: headroom

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows: for the CLI's table and the Prefect artifact."""
        rl = self.rl
        on_training_games = {e["name"].removesuffix("-train-games"): e for e in self.train_evaluations}
        on_same_settings = {e["name"].removesuffix("-training-settings"): e for e in self.same_settings_evaluations}
        rows = []
        for e in self.evaluations:
            seen, same = on_training_games.get(e["name"]), on_same_settings.get(e["name"])
            rows.append(
                (
                    f"success: {e['name']}",
                    f"held-out {e['success_rate']:.1%} (95% CI {e['ci95'][0]:.1%}-{e['ci95'][1]:.1%}, "
                    f"{e['episodes']} games, mean steps {e['mean_steps']:.1f})"
                    + (f"; held-out of the training settings {same['success_rate']:.1%}" if same else "")
                    + (f"; its training games {seen['success_rate']:.1%} ({seen['episodes']})" if seen else ""),
                )
            )
        how = "reused" if rl.reused else f"{rl.seconds / 60:.1f} min"
        return [
            *rows,
            (
                "RL",
                f"{rl.algorithm} in {rl.env}: {rl.epochs} epochs ({how}), real transitions "
                f"{rl.real_transitions}, synthetic {rl.synthetic_transitions} ({rl.recalled_transitions} recalled)",
            ),
            ("policy", self.model),
            ("MLflow run (policy)", self.mlflow_run_id),
        ]


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def variation_game_writer(out_dir: Path, config: PipelineConfig) -> WriteVariations:
    """The real environment's variations for `curriculum.variations: games`: TextWorld's games one
    step harder than their seed, ScienceWorld's train variations that the project has not used."""
    if config.env.name == "scienceworld":
        used = config.scienceworld.train_variations + config.scienceworld.task_variations
        return unseen_variation_writer(out_dir, config.seed, first=used)
    return harder_game_writer(out_dir, config.seed, config.games.workers)


@task(
    name="behaviour-cloning",
    cache_key_fn=stage_key(
        sections=("policy", "seed"), params=("out_dir",), files=("validated",), outputs=("out_dir",)
    ),
)
def bc_task(validated: str, out_dir: str, config: PipelineConfig) -> WarmStart:
    """BC on the successful real episodes; the untrained starting point is saved beside it."""
    rows = read_transitions(validated).to_pylist()
    kept = policy_kept_names(rows, config.policy)
    examples = bc_examples(rows, config.policy, kept)
    untrained = Path(out_dir) / "untrained"
    if not (untrained / "config.json").is_file():
        initial_policy(examples, config.policy, config.seed, kept).save(untrained)
    result = train_bc(examples, config.policy, Path(out_dir) / "bc", config.seed, kept, log_to_mlflow=True)
    get_run_logger().info(
        "BC: %d examples, %d steps (%s)",
        len(examples),
        result.steps,
        "reused" if result.reused else f"{result.seconds:.0f}s",
    )
    return WarmStart(
        untrained=str(untrained),
        bc=str(result.model_dir),
        examples=len(examples),
        steps=result.steps,
        seconds=result.seconds,
        reused=result.reused,
    )


def practises_training_tasks(config: PipelineConfig) -> bool:
    """Whether RL practises the training games' tasks beside the task games': with `games.target:
    same` it does; with another target it practises the target's tasks only, those the offline data
    never showed (BC wins its own training games, which would spend a real budget on nothing)."""
    return config.games.target == "same"


def dream_phase(config: PipelineConfig) -> PipelineConfig:
    """`config` for RL in DreamEnv, with the real-env budgets it never reads at their defaults: so
    DreamGym and DreamGym-S2R (whatever their real budgets) share one dream run, cached and on disk."""
    defaults = RLConfig()
    return dataclasses.replace(
        config, rl=dataclasses.replace(config.rl, real_budget=defaults.real_budget, s2r_budget=defaults.s2r_budget)
    )


def _log_epoch(prefix: str):
    """Each epoch's metrics to MLflow (`recalled_share` among them: the share of the epoch's DreamEnv
    steps answered from the recorded real transitions rather than the model)."""

    def log(metrics: dict[str, float]) -> None:
        mlflow.log_metrics(
            {f"{prefix}{key}": value for key, value in metrics.items() if key != "epoch"}, step=int(metrics["epoch"])
        )

    return log


@task(
    name="rl-in-dream-env",
    cache_key_fn=stage_key(
        sections=("rl", "curriculum", "experience", "buffer", "seed"),
        params=("start", "out_dir", "experience_dir", "experience_label", "run_dir"),
        files=("validated", "task_games_dir"),
        outputs=("out_dir",),
        environment=("DATABASE_URL",),
    ),
)
def dream_rl_task(
    start: str,
    out_dir: str,
    experience_dir: str,
    experience_label: str,
    validated: str,
    run_dir: str,
    config: PipelineConfig,
    train_games_dir: str | None = None,
    task_games_dir: str | None = None,
) -> RLResult:
    """RL in DreamEnv on the real initial states of the training tasks and of the games in
    `task_games_dir` (`games.task_count`: read by a reset, no step), with the curriculum and its
    variations (`curriculum.variations`); synthetic transitions written back. With
    `train_games_dir`, each epoch's seed tasks are also played in their real games (the
    dream-vs-real gap, logged per epoch; never learned from)."""
    from dreamgym.buffer.migrations import open_migrated
    from dreamgym.buffer.store import write_back
    from dreamgym.experience.generate import open_experience_model

    rows = read_transitions(validated).to_pylist()
    task_games = games_if_any(task_games_dir)
    seeds = (seed_tasks(rows) if practises_training_tasks(config) else []) + tasks_at_start(task_games)
    label = Path(out_dir).name
    with contextlib.ExitStack() as stack:
        experience = stack.enter_context(open_experience_model(experience_dir, run_dir, config))
        database = experience.database
        if config.rl.write_back and database is None:
            database = stack.enter_context(open_migrated(run_dir, config.buffer))
        game_writer = variation_game_writer(Path(out_dir) / "variation-games", config)
        curriculum = dream_curriculum(seeds, experience, config, game_writer)
        layered = experience.dynamics()  # the model with its rule layers
        dynamics = RecallingDynamics(layered, rows) if config.rl.recall_real else layered

        def make_env(slot: int) -> DreamEnv:
            return DreamEnv(
                dynamics,
                config.rl.max_steps,
                slot=slot,
                model_version=experience_label,
                policy=label,
                run_id=label,
                record=config.rl.write_back,
            )

        def write(rows: list[dict]) -> None:
            written = write_back(database, rows, config.buffer)
            get_run_logger().info("write-back: %d synthetic transitions, %d new", len(rows), written.inserted)

        real_check = None
        if train_games_dir is not None:
            game_of = {game.stem: game for game in [*games_if_any(train_games_dir), *task_games]}

            def real_task(task):  # a seed's game, or the real game a `games` variation is
                game = game_of.get(task.task_id) or task.game_file
                return load_task(game) if game is not None else None

            real_check = RealCheck(
                lambda: env_for(game_of.values(), config.rl.max_steps),
                real_task,
                config.rl.group_size,
                config.rl.temperature,
                config.seed,
            )
        return train_rl(
            start,
            make_env,
            curriculum,
            config.rl,
            out_dir,
            config.seed,
            on_epoch=_log_epoch("rl_"),
            on_transitions=write if config.rl.write_back else None,
            real_check=real_check,
        )


@task(
    name="rl-in-real-env",
    cache_key_fn=stage_key(
        sections=("rl", "curriculum", "seed"),
        params=("start", "out_dir", "budget"),
        files=("train_games_dir", "task_games_dir"),
        outputs=("out_dir",),
    ),
)
def real_rl_task(
    start: str,
    out_dir: str,
    train_games_dir: str,
    budget: int,
    config: PipelineConfig,
    prefix: str = "rl_",
    task_games_dir: str | None = None,
) -> RLResult:
    """RL in the real training games and those of `task_games_dir` (the tasks RL in DreamEnv
    practises too), stopped after `budget` real transitions."""
    training = list_games(train_games_dir) if practises_training_tasks(config) else []
    games = [*training, *games_if_any(task_games_dir)]
    seeds = [load_task(game) for game in games]
    curriculum = Curriculum(seeds, config.curriculum, config.seed)  # real games: no variations
    return train_rl(
        start,
        lambda slot: env_for(games, config.rl.max_steps),
        curriculum,
        config.rl,
        out_dir,
        config.seed,
        real_budget=budget,
        on_epoch=_log_epoch(prefix),
    )


@task(
    name="evaluate-policy",
    cache_key_fn=stage_key(
        sections=("evaluation", "seed"), params=("name", "policy_dir", "out_dir", "count"), files=("test_games_dir",)
    ),
)
def evaluate_task(
    name: str, policy_dir: str, test_games_dir: str, out_dir: str, config: PipelineConfig, count: int | None = None
) -> dict:
    """Success on the held-out games (or the first `count` games of another folder, e.g. the
    training games), cached by the policy's folder and the evaluation set."""
    games = held_out_games(config, test_games_dir) if count is None else list_games(test_games_dir)[:count]
    path = Path(out_dir) / f"eval-{name}-{_key(policy_dir, current_eval_set(config, games))}.json"
    if path.is_file():
        return json.loads(path.read_text())
    settings, pieces = config.evaluation, fanout()
    if pieces is None:
        report = evaluate_held_out(load_policy(policy_dir), games, config)
    else:  # the flow runs on Ray (flows/compute.py): shards of games, the same records and summary
        report = evaluate_in_pieces(
            policy_dir, games, settings.episodes_per_game, config.seed, settings.max_steps, settings.greedy, pieces
        )
    summary = write_report(report, path, {"name": name, "policy_dir": policy_dir, "json_path": str(path)})
    get_run_logger().info("%s: success %.1f%% on %d episodes", name, 100 * summary["success_rate"], summary["episodes"])
    return summary


@flow(name="train-policy")
def train_policy(
    config: PipelineConfig,
    ingested: IngestResult,
    experience: ExperienceResult,
    project_dir: str = ".",
    register_model: bool = True,
) -> PolicyResult:
    """BC → RL → (sim-to-real) → real evaluation → registry; see the module docstring."""
    project = Path(project_dir).resolve()
    run_dir = str(project / config.paths.run_dir)
    data_md5 = ingested.data_md5
    train_games_dir = str(project / config.paths.data_dir / "games" / "train")
    settings = config_to_dict(config)
    bc_key = _key(data_md5, settings["policy"], config.seed)
    root = project / config.paths.outputs_dir / "policy"
    bc_dir = root / f"bc-{bc_key}"
    experience_label = experience.model
    tags = {
        "dreamgym.data_md5": data_md5,
        "dreamgym.experience_model": experience_label,
        "dreamgym.ingest_run_id": ingested.mlflow_run_id,
    }
    with stage_run("train-policy", config, project, tags=tags) as run:
        log_dataset(ingested.validated_path, data_md5, ingested.dvc_file)
        stages = Stages()
        bc = stages.run(bc_task, ingested.validated_path, str(bc_dir), config)
        # A cache hit hands back the earlier run's result, `reused` as that run saw it.
        bc = dataclasses.replace(bc, reused=bc.reused or stages.was_cached(bc_task))

        phase = dream_phase(config) if config.rl.env == "dream" else config
        rl_key = _key(
            bc_key,
            experience_label if config.rl.env == "dream" else "real",
            config_to_dict(phase.rl),
            settings["curriculum"],
            *([] if config.games.target == "same" else [config.games.target]),  # other tasks: another run
        )
        rl_dir = root / f"rl-{config.rl.algorithm}-{config.rl.env}-{rl_key}"
        if config.rl.env == "dream":
            rl = stages.run(
                dream_rl_task,
                bc.bc,
                str(rl_dir),
                str(experience.train.model_dir),
                experience_label,
                ingested.validated_path,
                run_dir,
                phase,
                train_games_dir,
                ingested.task_games_dir,
            )
        else:
            rl = stages.run(
                real_rl_task,
                bc.bc,
                str(rl_dir),
                train_games_dir,
                config.rl.real_budget,
                config,
                task_games_dir=ingested.task_games_dir,
            )
        final, real_used, s2r_seconds = rl.policy_dir, rl.real_transitions, 0.0
        # Whether the last training phase was done by an earlier run (a bench goes on from there).
        trained_before = rl.reused or stages.was_cached(dream_rl_task if config.rl.env == "dream" else real_rl_task)
        curves = [
            plot_learning_curves(
                rl.history, rl_dir / "learning_curves.png", f"{config.rl.algorithm} in {config.rl.env}"
            )
        ]
        if config.rl.s2r_budget and config.rl.env == "dream":
            s2r = stages.run(
                real_rl_task,
                str(rl.policy_dir),
                str(root / f"s2r-{rl_key}-{config.rl.s2r_budget}"),
                train_games_dir,
                config.rl.s2r_budget,
                config,
                prefix="s2r_",
                task_games_dir=ingested.task_games_dir,
            )
            final, real_used, s2r_seconds = s2r.policy_dir, real_used + s2r.real_transitions, s2r.seconds
            trained_before = s2r.reused or stages.was_cached(real_rl_task)
            curves.append(
                plot_learning_curves(
                    s2r.history,
                    Path(s2r.policy_dir).parent / "learning_curves.png",
                    "sim-to-real: RL in the real games",
                )
            )
        for curve in curves:
            mlflow.log_artifact(str(curve), artifact_path="policy")

        test_dir = ingested.test_games_dir
        evals = [
            stages.run(evaluate_task, name, str(path), test_dir, str(root), config)
            for name, path in (("untrained", bc.untrained), ("bc", bc.bc), ("dreamgym", str(final)))
        ]
        # `games.target: headroom`: BC and the final policy on the held-out games of the training
        # settings too, so that a gain on the target is never bought with a loss there.
        same_dir = ingested.same_test_games_dir
        same_evals = [
            stages.run(evaluate_task, f"{name}-training-settings", str(path), same_dir, str(root), config)
            for name, path in (("bc", bc.bc), ("dreamgym", str(final)))
            if same_dir is not None
        ]
        train_evals = [
            stages.run(
                evaluate_task,
                f"{name}-train-games",
                str(path),
                train_games_dir,
                str(root),
                config,
                count=config.evaluation.train_games,
            )
            for name, path in (("bc", bc.bc), ("dreamgym", str(final)))
            if config.evaluation.train_games
        ]
        for summary in evals + same_evals + train_evals:
            mlflow.log_metrics(evaluation_metrics(summary, prefix=f"eval_{summary['name'].replace('-', '_')}_"))
            for path in (summary["json_path"], episodes_path(summary["json_path"])):
                mlflow.log_artifact(str(path), artifact_path="evaluation")
        comparison = plot_success(
            evals,
            root / f"success-{rl_key}-{config.rl.s2r_budget}.png",
            f"held-out games: {evals[0]['episodes']} episodes each",
        )
        mlflow.log_artifact(str(comparison), artifact_path="policy")
        mlflow.log_metrics(
            {
                "real_transitions": real_used,
                "synthetic_transitions": rl.synthetic_transitions,
                "recalled_transitions": rl.recalled_transitions,
            }
        )
        if not (stages.was_cached(dream_rl_task) or stages.was_cached(real_rl_task)):  # this run's work only
            mlflow.log_metric("rl_seconds", rl.seconds)
        model, bc_model = str(final), None
        if register_model:
            scores = {e["name"]: e for e in evals}
            eval_set = current_eval_set(config, held_out_games(config, test_dir))
            # BC is registered too, measured against itself: the champion while no RL policy beats it.
            bc_version = register_model_dir(
                bc.bc,
                MODEL_NAME,
                key=f"bc-{bc_key}",
                tags={
                    "data_md5": data_md5,
                    "rl": "bc",
                    "success_rate": f"{scores['bc']['success_rate']:.4f}",
                    "real_transitions": "0",
                    "eval_set": eval_set,
                    **evaluation_tags(scores["bc"], scores["bc"]),
                },
                artifact_path="bc-model",
            )
            bc_model = f"models:/{MODEL_NAME}/{bc_version}"
            version = register_model_dir(
                final,
                MODEL_NAME,
                key=f"{rl_key}-{config.rl.s2r_budget}",
                tags={
                    "data_md5": data_md5,
                    "experience_model": experience_label,
                    "rl": f"{config.rl.algorithm}-{config.rl.env}",
                    "success_rate": f"{evals[-1]['success_rate']:.4f}",
                    "real_transitions": str(real_used),
                    "eval_set": eval_set,
                    **evaluation_tags(scores["dreamgym"], scores["bc"]),
                },
            )
            set_challenger(MODEL_NAME, version)
            model = f"models:/{MODEL_NAME}/{version}"
        mlflow.set_tag("dreamgym.policy", model)
        stages.tag()
        result = PolicyResult(
            mlflow_run_id=run.info.run_id,
            model=model,
            bc=bc,
            bc_model=bc_model,
            rl=RLSummary(
                algorithm=config.rl.algorithm,
                env=config.rl.env,
                epochs=len(rl.history),
                history=rl.history,
                real_transitions=real_used,
                synthetic_transitions=rl.synthetic_transitions,
                seconds=rl.seconds,
                s2r_seconds=s2r_seconds,
                reused=trained_before,
                recalled_transitions=rl.recalled_transitions,
            ),
            evaluations=evals,
            train_evaluations=train_evals,
            same_settings_evaluations=same_evals,
        )
        create_markdown_artifact(
            key="policy-summary",
            description="Policies trained and evaluated",
            markdown=markdown_table("Policy", result.rows()),
        )
        return result
