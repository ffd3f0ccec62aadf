"""Ingest flow: games → collect → validate → version → buffer upsert, logged to MLflow.

Generates the training and held-out TextWorld games (or writes ScienceWorld's task files, with
`env.name: scienceworld`), collects offline trajectories on the training games, validates them
with Great Expectations (quarantining bad rows), versions the dataset with DVC, and upserts the
validated transitions into the replay buffer. One MLflow run records the parameters, the dataset
(with the DVC md5 as its digest), the collection, validation and buffer metrics and the
validation report.

Every step reuses what is already there: existing games are not regenerated, a collection with
the same games and settings is not repeated, and unchanged data keeps its DVC version.

Run it with `dreamgym run`, which sets up the embedded services first.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import mlflow
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.tasks import exponential_backoff

from dreamgym.buffer.config import BufferConfig
from dreamgym.buffer.migrations import open_migrated
from dreamgym.buffer.store import UpsertResult, ingest_file
from dreamgym.config import PipelineConfig
from dreamgym.data.collect import CollectionResult, CollectionSettings, collect
from dreamgym.data.config import ValidationConfig
from dreamgym.data.overview import plot_dataset
from dreamgym.data.schema import read_transitions
from dreamgym.data.validation import ValidationResult, validate_transitions
from dreamgym.data.versioning import DataVersion, commit_stage, version_data
from dreamgym.envs.scienceworld.config import ScienceWorldConfig
from dreamgym.envs.scienceworld.tasks import write_tasks
from dreamgym.envs.textworld.config import GamesConfig
from dreamgym.envs.textworld.games import generate_games, plan_games, target_folder, target_settings
from dreamgym.errors import DreamgymError
from dreamgym.ops.fanout import collect_in_pieces, generate_in_pieces
from dreamgym.ops.tracking import stage_run
from flows.caching import Stages, stage_key
from flows.compute import fanout

TRAJECTORIES_FILE = "trajectories/offline.parquet"


@dataclass(frozen=True)
class IngestResult:
    """What the ingest flow made: the versioned data the next stages read, and how it was made."""

    mlflow_run_id: str
    data_md5: str  # the dataset version (DVC md5)
    dvc_file: str
    data_changed: bool  # false: the data is what an earlier run versioned
    cached_stages: list[str]  # task names an earlier run did (Stages.cached)
    train_games: int
    test_games: int
    task_games: int
    test_games_dir: str  # the held-out games of `games.target`: the gate's
    task_games_dir: str  # training-split games whose tasks RL practises; no trajectories of them
    # With `games.target: headroom`, the held-out games of the training settings, played beside.
    same_test_games_dir: str | None
    collection: CollectionResult
    validation: ValidationResult
    validated_path: str  # the rows that passed validation: what every later stage reads
    buffer: UpsertResult
    buffer_cached: bool  # true: `buffer` is what an earlier run inserted, nothing this run

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows: for the Prefect artifact and the CLI's table."""
        collection, validation, buffer = self.collection, self.validation, self.buffer
        how = "reused" if collection.reused else f"collected in {collection.seconds:.0f}s"
        return [
            ("data version (DVC md5)", f"{self.data_md5} ({'new' if self.data_changed else 'unchanged'})"),
            ("games (train / held-out test / RL tasks)", f"{self.train_games} / {self.test_games} / {self.task_games}"),
            ("transitions / trajectories", f"{collection.transitions} / {collection.trajectories} ({how})"),
            ("success rate in the data", f"{collection.success_rate:.1%}"),
            ("quarantined rows", f"{validation.quarantined_rows} ({validation.bad_fraction:.2%})"),
            (
                "buffer rows inserted / already there",
                f"nothing this run: cached (an earlier run inserted {buffer.inserted})"
                if self.buffer_cached
                else f"{buffer.inserted} / {buffer.skipped}",
            ),
            ("stages done by an earlier run (cached)", ", ".join(self.cached_stages) or "none"),
            ("MLflow run", self.mlflow_run_id),
        ]


@task(
    name="write-scienceworld-tasks",
    retries=1,
    cache_key_fn=stage_key(params=("out_dir", "split", "per_type", "seed", "settings", "first"), outputs=("out_dir",)),
)
def scienceworld_tasks_task(
    out_dir: str, split: str, per_type: int, seed: int, settings: ScienceWorldConfig, first: int = 0
) -> list[str]:
    paths = write_tasks(settings.tasks, split, per_type, seed, out_dir, first)
    get_run_logger().info("%d ScienceWorld %s tasks in %s", len(paths), split, out_dir)
    return [str(path) for path in paths]


def scienceworld_games(
    config: PipelineConfig, train_dir: Path, test_dir: Path, tasks_dir: Path
) -> tuple[list[str], list[str], list[str]]:
    """The training, held-out and RL-practised tasks of `env.name: scienceworld`: variations of the
    task types from ScienceWorld's train split (the practised ones after the training ones) and
    from its test split."""
    settings, seed = config.scienceworld, config.seed
    train = scienceworld_tasks_task(str(train_dir), "train", settings.train_variations, seed, settings)
    test = scienceworld_tasks_task(str(test_dir), "test", settings.test_variations, seed, settings)
    practised = scienceworld_tasks_task(
        str(tasks_dir), "train", settings.task_variations, seed, settings, first=settings.train_variations
    )
    return train, test, practised


@task(
    name="generate-games",
    retries=1,
    cache_key_fn=stage_key(params=("out_dir", "split", "count", "seed", "games", "first"), outputs=("out_dir",)),
)
def generate_games_task(
    out_dir: str,
    split: str,
    count: int,
    seed: int,
    games: GamesConfig,
    first: int = 0,
) -> list[str]:
    specs, pieces = plan_games(games, split, count, seed, first), fanout()
    if pieces is None:
        paths, made = generate_games(specs, out_dir, workers=games.workers)
    else:  # the flow runs on Ray (flows/compute.py): the same games, made by its workers
        paths, made = generate_in_pieces(specs, out_dir, pieces)
    get_run_logger().info("%s games in %s: %d made, %d reused", split, out_dir, made, len(paths) - made)
    return [str(path) for path in paths]


@task(
    name="collect-trajectories", cache_key_fn=stage_key(params=("out", "settings"), files=("games",), outputs=("out",))
)
def collect_task(
    games: list[str], out: str, settings: CollectionSettings, workers: int, run_id: str
) -> CollectionResult:
    pieces = fanout()
    if pieces is None:
        result = collect(games, out, settings, workers=workers, run_id=run_id)
    else:  # the flow runs on Ray (flows/compute.py): the same rows, played by its workers
        result = collect_in_pieces(games, out, settings, pieces, run_id=run_id)
    get_run_logger().info(
        "%s %d transitions in %d trajectories (success %.0f%%) in %.1fs",
        "reused" if result.reused else "collected",
        result.transitions,
        result.trajectories,
        100 * result.success_rate,
        result.seconds,
    )
    return result


@task(
    name="validate-trajectories",
    cache_key_fn=stage_key(params=("out_dir", "config"), files=("trajectories",), outputs=("out_dir",)),
)
def validate_task(trajectories: str, out_dir: str, config: ValidationConfig) -> ValidationResult:
    out = Path(out_dir)
    # The same outputs as the `validate` stage of dvc.yaml.
    result = validate_transitions(
        trajectories,
        config,
        quarantine_path=out / "quarantine.parquet",
        report_path=out / "report.json",
        clean_path=out / "validated.parquet",
        metrics_path=out / "metrics.json",
    )
    get_run_logger().info(result.summary())
    return result


@task(
    name="upsert-buffer",
    retries=3,
    retry_delay_seconds=exponential_backoff(backoff_factor=5),
    cache_key_fn=stage_key(
        params=("data_version", "run_dir", "config"), files=("validated",), environment=("DATABASE_URL",)
    ),
)
def upsert_task(validated: str, data_version: str, run_dir: str, config: BufferConfig) -> UpsertResult:
    """Only validated rows enter the buffer; a retry re-inserts nothing already committed."""
    with open_migrated(run_dir, config) as database:
        result = ingest_file(database, validated, config, data_version)
    get_run_logger().info(
        "buffer: %d inserted, %d already there (%.1fs%s)",
        result.inserted,
        result.skipped,
        result.seconds,
        ", HNSW index rebuilt" if result.bulk else "",
    )
    return result


@task(
    name="version-data",
    retries=3,
    retry_delay_seconds=exponential_backoff(backoff_factor=2),
    cache_key_fn=stage_key(params=("project_dir", "data_dir"), files=("data_dir",)),
)
def version_task(project_dir: str, data_dir: str) -> DataVersion:
    """`dvc add` the data folder (`data_dir`: its absolute path, directly in the project)."""
    version = version_data(project_dir, Path(data_dir).name)
    if (Path(project_dir) / "dvc.yaml").is_file():
        commit_stage(project_dir, "validate")
    get_run_logger().info("data version %s (%s)", version.md5, "new" if version.changed else "unchanged")
    return version


def log_dataset(path: str, md5: str, dvc_file: str) -> None:
    """Record the validated dataset as the active run's input, identified by its DVC md5."""
    frame = read_transitions(path).to_pandas()
    with warnings.catch_warnings():
        # MLflow hints that integer columns cannot hold missing values (ours never do) and that a
        # local path could be one of two equivalent local source kinds.
        warnings.simplefilter("ignore", UserWarning)
        dataset = mlflow.data.from_pandas(
            frame, source=str(Path(path).resolve()), name="offline-transitions", digest=md5
        )
        mlflow.log_input(dataset, context="offline", tags={"dvc_md5": md5, "dvc_file": Path(dvc_file).name})


@flow(name="ingest")
def ingest(config: PipelineConfig, project_dir: str = ".") -> IngestResult:
    """Make (or reuse) the versioned offline dataset and return what a next stage needs."""
    project = Path(project_dir).resolve()
    data_dir = project / config.paths.data_dir
    outputs_dir = project / config.paths.outputs_dir / "validation"
    settings = CollectionSettings.from_config(config)
    with stage_run("ingest", config, project, tags={"prefect.flow_run_id": str(flow_run.get_id())}) as run:
        games_dir = data_dir / "games"
        test_games_dir = games_dir / target_folder("test", config.games)
        task_games_dir = games_dir / target_folder("tasks", config.games)
        same_test_games_dir = None
        if config.env.name == "scienceworld":
            train_games, test_games, task_games = scienceworld_games(
                config, games_dir / "train", test_games_dir, task_games_dir
            )
        else:
            train_games = generate_games_task(
                str(games_dir / "train"), "train", config.games.train_count, config.seed, config.games
            )
            target = target_settings(config.games)
            if config.games.target_train_count:
                # A few of the target's games, after the task games: without them BC and the
                # experience model never see a third ingredient (results log, 2026-12-05, night, last).
                train_games += generate_games_task(
                    str(games_dir / "train"),
                    "train",
                    config.games.target_train_count,
                    config.seed,
                    target,
                    first=config.games.train_count + config.games.task_count,
                )
            test_games = generate_games_task(str(test_games_dir), "test", config.games.test_count, config.seed, target)
            if config.games.target != "same":
                same_test_games_dir = games_dir / "test"
                generate_games_task(
                    str(same_test_games_dir), "test", config.games.test_count, config.seed, config.games
                )
            # The games after the training ones: tasks for RL, no trajectories collected.
            task_games = generate_games_task(
                str(task_games_dir),
                "train",
                config.games.task_count,
                config.seed,
                target,
                first=config.games.train_count,
            )
        stages = Stages()
        collection = stages.run(
            collect_task,
            train_games,
            str(data_dir / TRAJECTORIES_FILE),
            settings,
            config.collect.workers,
            run.info.run_id,
        )
        mlflow.log_metrics(
            {
                "train_games": len(train_games),
                "test_games": len(test_games),
                "task_games": len(task_games),
                "collect_transitions": collection.transitions,
                "collect_trajectories": collection.trajectories,
                "collect_success_rate": collection.success_rate,
                "collect_mean_steps": collection.mean_steps,
            }
        )
        if not stages.was_cached(collect_task):  # work this run did, not an earlier run's
            mlflow.log_metric("collect_seconds", collection.seconds)

        validation = stages.run(validate_task, collection.path, str(outputs_dir), config.validation)
        mlflow.log_metrics(
            {
                "validation_rows": validation.rows,
                "validation_quarantined_rows": validation.quarantined_rows,
                "validation_bad_fraction": validation.bad_fraction,
                "validation_passed": float(validation.passed),
            }
        )
        overview = plot_dataset(read_transitions(collection.path), outputs_dir / "dataset_overview.png")
        mlflow.log_artifact(str(overview), artifact_path="validation")
        mlflow.log_artifact(validation.report_path, artifact_path="validation")
        mlflow.log_artifact(validation.quarantine_path, artifact_path="validation")
        if not validation.passed:
            raise DreamgymError(
                f"validation failed: {validation.bad_fraction:.1%} of rows quarantined, above "
                f"validation.max_bad_fraction={config.validation.max_bad_fraction:g}; see "
                f"{validation.quarantine_path} for the rows and reasons"
            )

        version = stages.run(version_task, str(project), str(data_dir))
        mlflow.set_tag("dreamgym.data_md5", version.md5)
        log_dataset(validation.clean_path, version.md5, version.dvc_file)

        upserted = stages.run(
            upsert_task, validation.clean_path, version.md5, str(project / config.paths.run_dir), config.buffer
        )
        if not stages.was_cached(upsert_task):
            mlflow.log_metrics(
                {
                    "buffer_inserted": upserted.inserted,
                    "buffer_skipped": upserted.skipped,
                    "buffer_upsert_seconds": upserted.seconds,
                }
            )
        stages.tag()

        result = IngestResult(
            mlflow_run_id=run.info.run_id,
            data_md5=version.md5,
            dvc_file=version.dvc_file,
            # A cached versioning step means the data is what an earlier run versioned: unchanged.
            data_changed=version.changed and not stages.was_cached(version_task),
            cached_stages=list(stages.cached),
            train_games=len(train_games),
            test_games=len(test_games),
            task_games=len(task_games),
            test_games_dir=str(test_games_dir),
            task_games_dir=str(task_games_dir),
            same_test_games_dir=None if same_test_games_dir is None else str(same_test_games_dir),
            collection=collection,
            validation=validation,
            validated_path=validation.clean_path,
            buffer=upserted,
            buffer_cached=stages.was_cached(upsert_task),
        )
        create_markdown_artifact(
            key="ingest-summary",
            markdown=markdown_table("Ingest", result.rows()),
            description="Offline dataset made by the ingest flow",
        )
        return result


def markdown_table(title: str, rows: list[tuple[str, str]]) -> str:
    """Summary rows as the Markdown of a Prefect artifact."""
    return f"## {title}\n\n| | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
