"""Experience-model flow: build examples → train (SFT) → evaluate against the real game → register.

Takes what the ingest flow returned (validated transitions, their DVC md5, the held-out games),
builds retrieval-augmented SFT examples from the buffer, trains the experience model with TRL,
measures its fidelity on real transitions of held-out games, and registers it in MLflow as
`dreamgym-experience` with its data version and configuration. One MLflow run records all of it.

Re-running reuses work: examples for the same data and example settings are read back, and
training resumes from its last checkpoint (a finished training is not repeated).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mlflow
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.tasks import exponential_backoff

from dreamgym.buffer.migrations import open_migrated
from dreamgym.config import PipelineConfig, load_config
from dreamgym.data.collect import collect_held_out, held_out_collection
from dreamgym.data.schema import read_transitions
from dreamgym.envs.real import task_setting
from dreamgym.experience.ablation import FULL, Variant, ablation_rows, markdown, plot, trained, variants
from dreamgym.experience.affordances import AFFORDANCES_FILE, saved_beside
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.examples import load_examples, load_kept_names, save_examples
from dreamgym.experience.format import FORMAT_VERSION
from dreamgym.experience.generate import save_settings
from dreamgym.experience.report import measure_fidelity
from dreamgym.experience.rerank import RANKING_VERSION
from dreamgym.experience.variations import training_examples
from dreamgym.lm.sft import TrainResult, plot_losses, train_sft
from dreamgym.ops.fanout import collect_in_pieces
from dreamgym.ops.registry import register_model_dir
from dreamgym.ops.tracking import stage_run
from dreamgym.sections import config_part
from flows.caching import Stages, stage_key
from flows.compute import fanout
from flows.ingest import IngestResult, ingest, log_dataset, markdown_table

MODEL_NAME = "dreamgym-experience"


@dataclass(frozen=True)
class ExperienceResult:
    """What the experience flow made: the model (a registry reference, or its folder when not
    registered), how it trained, and its fidelity on held-out real transitions."""

    mlflow_run_id: str
    model: str
    train: TrainResult
    fidelity: dict  # `experience.report` summary: the figures fidelity_summary.json holds

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows: for the CLI's table and the Prefect artifact."""
        train, fidelity = self.train, self.fidelity
        how = "reused" if train.reused else f"{train.seconds / 60:.1f} min, {train.tokens_per_second:.0f} tokens/s"
        return [
            ("experience model", f"{self.model} ({train.parameters / 1e6:.1f}M parameters)"),
            ("training", f"{train.steps} steps ({how})"),
            (
                "fidelity on held-out games",
                f"{fidelity['transitions']} real transitions: next state exact "
                f"{fidelity['next_state_exact_match']:.1%}, reward "
                f"{fidelity['reward_accuracy']:.1%}, done {fidelity['done_accuracy']:.1%}, "
                f"parse failures {fidelity['parse_failure_rate']:.1%}",
            ),
            (
                "… foreseeable from the prompt",
                f"{fidelity['foreseeable']['transitions']} of them: next state exact "
                f"{fidelity['foreseeable']['next_state_exact_match']:.1%}",
            ),
            ("MLflow run (experience)", self.mlflow_run_id),
        ]


def examples_key(data_md5: str, config: ExperienceConfig, encoder: str) -> str:
    """What the examples depend on: the data and the settings that shape a prompt."""
    shaping = {
        "format": FORMAT_VERSION,
        "ranking": RANKING_VERSION,
        "data": data_md5,
        "encoder": encoder,
        **config_part(config, "prompt", "examples", "retrieval"),
    }
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


@task(
    name="build-examples",
    cache_key_fn=stage_key(
        sections=("experience", "buffer"), params=("data_md5", "out_dir", "run_dir"), outputs=("out_dir",)
    ),
)
def examples_task(validated: str, data_md5: str, out_dir: str, run_dir: str, config: PipelineConfig) -> str:
    path = Path(out_dir) / f"examples-{examples_key(data_md5, config.experience, config.buffer.encoder)}.parquet"
    if path.is_file():
        get_run_logger().info("examples reused: %s", path)
        return str(path)
    rows = read_transitions(validated).to_pylist()
    with open_migrated(run_dir, config.buffer) as database:
        made = training_examples(database, rows, config, progress=True)
    if made.affordances is not None:  # before the examples, whose file says the step is done
        made.affordances.save(saved_beside(path))
    save_examples(made.examples, path, kept=made.kept)
    get_run_logger().info("%d examples built: %s", len(made.examples), path)
    return str(path)


@task(
    name="train-experience-model",
    cache_key_fn=stage_key(params=("examples_path", "out_dir", "config", "seed"), outputs=("out_dir",)),
)
def train_task(examples_path: str, out_dir: str, config: ExperienceConfig, seed: int):
    examples = [{"prompt": e.prompt, "completion": e.completion} for e in load_examples(examples_path)]
    result = train_sft(examples, config, Path(out_dir), seed=seed, log_to_mlflow=True)
    save_settings(result.model_dir, config, load_kept_names(examples_path))
    if config.adapts_examples:
        shutil.copyfile(saved_beside(examples_path), Path(result.model_dir) / AFFORDANCES_FILE)
    get_run_logger().info(
        "trained %d steps in %.0fs (%.0f tokens/s)", result.steps, result.seconds, result.tokens_per_second
    )
    return result


@task(
    name="collect-fidelity-transitions",
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=2),
    cache_key_fn=stage_key(
        sections=("experience", "env", "collect", "seed"), params=("out",), files=("test_games_dir",), outputs=("out",)
    ),
)
def real_transitions_task(test_games_dir: str, out: str, config: PipelineConfig) -> str:
    pieces = fanout()
    if pieces is None:
        return collect_held_out(test_games_dir, out, config)
    games, settings = held_out_collection(test_games_dir, config)  # on Ray (flows/compute.py): the same rows
    return collect_in_pieces(games, out, settings, pieces).path


@task(
    name="evaluate-fidelity",
    cache_key_fn=stage_key(
        sections=("experience", "buffer", "seed"),
        params=("model_dir", "run_dir", "copy_neighbours"),
        files=("real_path",),
    ),
)
def evaluate_task(
    model_dir: str, real_path: str, run_dir: str, config: PipelineConfig, copy_neighbours: bool = False
) -> dict:
    """Fidelity of the model in `model_dir`, or with `copy_neighbours` of no model: its prompts'
    top neighbour's change (`NeighbourCopy`)."""
    return measure_fidelity(model_dir, real_path, run_dir, config, copy_neighbours, setting_of=task_setting)


@flow(name="train-experience")
def train_experience(
    config: PipelineConfig,
    ingested: IngestResult,
    project_dir: str = ".",
    register_model: bool = True,
    run_name: str = "train-experience",
) -> ExperienceResult:
    """Examples → training → fidelity → registry (unless `register_model` is false: ablations)."""
    project = Path(project_dir).resolve()
    run_dir = str(project / config.paths.run_dir)
    out_dir = project / config.paths.outputs_dir / "experience"
    data_md5 = ingested.data_md5
    tags = {"dreamgym.data_md5": data_md5, "dreamgym.ingest_run_id": ingested.mlflow_run_id}
    with stage_run("train-experience", config, project, run_name=run_name, tags=tags) as run:
        log_dataset(ingested.validated_path, data_md5, ingested.dvc_file)
        stages = Stages()
        examples = stages.run(examples_task, ingested.validated_path, data_md5, str(out_dir), run_dir, config)
        model_key = Path(examples).stem.removeprefix("examples-") + f"-{_training_key(config)}"
        trained = stages.run(train_task, examples, str(out_dir / f"model-{model_key}"), config.experience, config.seed)
        mlflow.log_artifact(
            str(plot_losses(trained, out_dir / f"model-{model_key}" / "loss.png")), artifact_path="experience"
        )
        # Fidelity on held-out games of the training settings (with `games.target: headroom` too), so
        # that its figure stays comparable from run to run.
        fidelity_games = ingested.same_test_games_dir or ingested.test_games_dir
        real = stages.run(real_transitions_task, fidelity_games, str(out_dir / "fidelity_real.parquet"), config)
        fidelity = stages.run(evaluate_task, str(trained.model_dir), real, run_dir, config)
        stages.tag()
        model = str(trained.model_dir)
        if register_model:
            version = register_model_dir(
                trained.model_dir,
                MODEL_NAME,
                key=model_key,
                tags={"data_md5": data_md5, "examples": Path(examples).name},
            )
            model = f"models:/{MODEL_NAME}/{version}"
        mlflow.set_tag("dreamgym.model", model)
        result = ExperienceResult(mlflow_run_id=run.info.run_id, model=model, train=trained, fidelity=fidelity)
        create_markdown_artifact(
            key="experience-summary",
            description="Experience model trained and measured",
            markdown=markdown_table("Experience model", result.rows()),
        )
        return result


def _training_key(config: PipelineConfig) -> str:
    """Training settings that make a different model (a changed one trains a new folder)."""
    # Generation, backend, evaluation and checkpoint settings change how a model is used or
    # saved, not the model.
    settings = config_part(config.experience, "prompt", "examples", "model", "training") | {"seed": config.seed}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


@flow(name="ablate-experience")
def ablate_experience(
    config: PipelineConfig, ingested: IngestResult, project_dir: str = ".", slices: Sequence[str] = ()
) -> dict:
    """The configured experience model, the LM and its rule layers each without the other, each
    layer removed, and the paper's ablations (`dreamgym.experience.ablation`), trained and measured
    alike on the run's held-out games and on each games folder of `slices`; one parent MLflow run
    holds the tables (Markdown, JSON) and their plot, each variant a nested run."""
    project = Path(project_dir).resolve()
    out_dir = project / config.paths.outputs_dir / "experience"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_of = variants(config)
    with stage_run("ablate-experience", config, project, tags={"dreamgym.data_md5": ingested.data_md5}) as run:
        models = {
            name: train_experience(
                variant, ingested, project_dir, register_model=name == FULL, run_name=f"experience: {name}"
            )
            for name, variant in trained(rows_of).items()
        }
        held_out = ingested.same_test_games_dir or ingested.test_games_dir  # as train_experience measures
        rows = []
        for games in [held_out, *slices]:
            file_name = "fidelity_real.parquet" if games == held_out else f"fidelity_real-{_slice_key(games)}.parquet"
            real = real_transitions_task(games, str(out_dir / file_name), config)
            results = {
                name: variant_fidelity(name, row, models[row.model_of], real, project) for name, row in rows_of.items()
            }
            rows += ablation_rows(results, _slice_name(games, project))
        table = markdown(rows)
        (out_dir / "ablation.md").write_text(table + "\n")
        (out_dir / "ablation.json").write_text(json.dumps(rows, indent=2))
        for path in (out_dir / "ablation.md", out_dir / "ablation.json", plot(rows, out_dir / "ablation.png")):
            mlflow.log_artifact(str(path), artifact_path="ablation")
        create_markdown_artifact(
            key="experience-ablation",
            markdown="## Experience model ablations\n\n" + table,
            description="Fidelity of the LM and its rule layers, each without the other, and the paper's ablations",
        )
        return {"mlflow_run_id": run.info.run_id, "rows": rows, "table": table}


def _slice_key(games: str) -> str:
    """A file-name key for a games folder: its name and a hash of its whole path."""
    path = str(Path(games).resolve())
    return f"{Path(path).name}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def _slice_name(games: str, project: Path) -> str:
    path = Path(games).resolve()
    return str(path.relative_to(project)) if path.is_relative_to(project) else str(path)


def variant_fidelity(name: str, variant: Variant, model: ExperienceResult, real: str, project: Path) -> dict:
    """One row's fidelity on the real transitions in `real`, in its own nested MLflow run: the
    trained model of `variant.model_of` used with the row's settings, or its top example copied
    (`NeighbourCopy`). Cached by model, settings and transitions: a model's own row on its own
    held-out games is what `train_experience` measured already."""
    with stage_run("experience-ablation-row", variant.config, project, run_name=f"experience: {name}"):
        return evaluate_task(
            str(model.train.model_dir),
            real,
            str(project / variant.config.paths.run_dir),
            variant.config,
            copy_neighbours=variant.copied,
        )


@flow(name="experience-ablation")
def ablation(params: str = "params.yaml", slices: Sequence[str] = ()) -> dict:
    """`dreamgym experience ablate`: the data (ingest, cached when unchanged), then the ablations,
    measured on the run's held-out games and on the games folders `slices`."""
    params_path = Path(params).resolve()
    config = load_config(params_path)
    project = str(params_path.parent)
    return ablate_experience(config, ingest(config, project), project, [str(Path(s).resolve()) for s in slices])
