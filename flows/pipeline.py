"""The whole pipeline as one Prefect flow: ingest → validate → upsert → experience SFT → fidelity →
RL in DreamEnv with the curriculum → real held-out evaluation → promotion gate.

Each stage is a sub-flow made of versioned tasks (flows/caching.py): an unchanged re-run is a
cache hit, and a changed parameter re-runs the tasks that read it and those downstream. Stages
pass IDs (DVC md5, MLflow run ids, model versions) and paths, never large objects.

MLflow lineage: one parent run per pipeline run and a nested run per stage. Each records the full
resolved config, the git commit and the dataset (DVC md5) as its input; the parent also records
the model versions produced and the promotion decision. `dreamgym lineage` walks it back.

Run it with `dreamgym run` (embedded services set up first) or as the `nightly` deployment of
prefect.yaml (`dreamgym serve`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mlflow
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

from dreamgym.config import PipelineConfig, config_to_dict, flatten, load_config
from dreamgym.data.versioning import commit_stage, dvc_stage_params
from dreamgym.errors import DreamgymError
from dreamgym.promotion import POLICY_MODEL_NAME, Decision, gate, held_out_evaluator
from dreamgym.tracking import configure_services, experiment_id, git_commit
from flows.caching import stage_key
from flows.ingest import ingest, log_dataset, markdown_table, summary_rows
from flows.train_experience import experience_rows, train_experience
from flows.train_policy import policy_rows, train_policy


@task(name="promotion-gate", cache_key_fn=stage_key(sections=("promotion",), params=("name", "version")))
def promotion_task(name: str, version: str, config: PipelineConfig, project_dir: str) -> dict:
    """The gate for a new version; its decision is final, so a re-run with the same challenger
    and gate settings is a cache hit that changes nothing. A champion measured on another
    held-out set is measured again on the current one."""
    decision = gate(name, version, config.promotion, evaluate=held_out_evaluator(config, project_dir))
    get_run_logger().info("promotion of %s/%s: %s", name, version, decision.reason)
    return decision_summary(decision)


def decision_summary(decision: Decision) -> dict:
    return {
        "promoted": decision.promote,
        "reason": decision.reason,
        "p_value": decision.p_value,
        "challenger": asdict(decision.challenger),
        "baseline": asdict(decision.baseline),
        "metrics": decision.metrics(),
        "tags": decision.tags(),
    }


@task(
    name="record-dvc-stage",
    retries=2,
    retry_delay_seconds=2,
    cache_key_fn=stage_key(params=("project_dir", "stage", "settings"), files=("metrics_path",)),
)
def record_stage_task(project_dir: str, stage: str, metrics_path: str, settings: dict) -> None:
    """Record a dvc.yaml stage the flow just ran (its metrics file written) in dvc.lock, so that
    `dvc status` agrees with the run. `settings` are the stage's params: part of the cache key."""
    commit_stage(project_dir, stage)


def write_stage_metrics(project: Path, config: PipelineConfig, summary: dict, stage: str) -> None:
    """The stage's headline figures in `<outputs_dir>/metrics/<stage>.json` (dvc.yaml's metrics),
    and the stage recorded in dvc.lock when dvc.yaml defines it."""
    path = project / config.paths.outputs_dir / "metrics" / f"{stage}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(stage_metrics(summary, stage), indent=2, sort_keys=True) + "\n"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    declared = dvc_stage_params(project, stage)
    if declared is not None:
        settings = config_to_dict(config)
        record_stage_task(str(project), stage, str(path), {key: settings[key] for key in declared})


@flow(name="promote")
def promote(config: PipelineConfig, ingest_summary: dict, policy_summary: dict, project_dir: str = ".") -> dict:
    """The promotion stage: its own nested MLflow run holding the decision and its numbers."""
    project = Path(project_dir).resolve()
    model = policy_summary["model"]
    if not model.startswith(f"models:/{POLICY_MODEL_NAME}/"):
        return {"promoted": False, "reason": "the policy was not registered (register_model off)"}
    version = model.rsplit("/", 1)[1]
    mlflow.set_experiment(experiment_id=experiment_id(config.experiment, project / config.paths.run_dir))
    with mlflow.start_run(run_name="promotion", nested=mlflow.active_run() is not None):
        mlflow.set_tags(
            {
                "dreamgym.stage": "promotion",
                "git_commit": git_commit(project),
                "dreamgym.data_md5": ingest_summary["data_md5"],
                "dreamgym.policy": model,
            }
        )
        mlflow.log_params(flatten(config_to_dict(config)))
        log_dataset(ingest_summary["validated_path"], ingest_summary["data_md5"], ingest_summary["dvc_file"])
        decision = promotion_task(POLICY_MODEL_NAME, version, config, str(project))
        mlflow.log_metrics(decision["metrics"])
        mlflow.set_tags(decision["tags"])
        create_markdown_artifact(
            key="promotion",
            description="Promotion gate of the new policy version",
            markdown=markdown_table("Promotion", promotion_rows(decision)),
        )
        return decision


def promotion_rows(decision: dict) -> list[tuple[str, str]]:
    return [
        ("promotion", ("promoted to champion: " if decision["promoted"] else "not promoted: ") + decision["reason"])
    ]


STAGES = ("ingest", "experience", "policy", "promotion")


@flow(name="dreamgym-pipeline")
def pipeline(
    params: str = "params.yaml",
    overrides: dict[str, Any] | None = None,
    refresh: bool = False,
    until: str = "promotion",
) -> dict:
    """The pipeline on the configuration in `params` (with dotted-key `overrides`), from ingest
    through the stage `until` (the DVC stages run it stage by stage); `refresh` ignores cached
    task results and recomputes them."""
    if until not in STAGES:
        raise DreamgymError(f"until={until!r} is not a stage; use one of {', '.join(STAGES)}")
    params_path = Path(params).resolve()
    config = load_config(params_path, overrides)
    project = params_path.parent
    run_dir = project / config.paths.run_dir
    configure_services(run_dir)  # a deployment's worker may not have; never overrides what is set
    with temporary_settings({PREFECT_TASKS_REFRESH_CACHE: refresh}):
        mlflow.set_experiment(experiment_id=experiment_id(config.experiment, run_dir))
        with mlflow.start_run(run_name="pipeline") as run:
            mlflow.set_tags(
                {
                    "dreamgym.stage": "pipeline",
                    "git_commit": git_commit(project),
                    "prefect.flow_run_id": str(flow_run.get_id()),
                }
            )
            settings = config_to_dict(config)
            mlflow.log_params(flatten(settings))
            mlflow.log_dict(settings, "config/params.json")

            summary = {"mlflow_run_id": run.info.run_id, "prefect_flow_run_id": str(flow_run.get_id())}
            summary["ingest"] = ingested = ingest(config, str(project))  # records its own DVC stage
            mlflow.set_tag("dreamgym.data_md5", ingested["data_md5"])
            log_dataset(ingested["validated_path"], ingested["data_md5"], ingested["dvc_file"])
            if STAGES.index(until) >= STAGES.index("experience"):
                summary["experience"] = experience = train_experience(config, ingested, str(project))
                mlflow.set_tag("dreamgym.experience_model", experience["model"])
                write_stage_metrics(project, config, summary, "experience")
            if STAGES.index(until) >= STAGES.index("policy"):
                summary["policy"] = policy = train_policy(config, ingested, experience, str(project))
                mlflow.set_tag("dreamgym.policy", policy["model"])
                write_stage_metrics(project, config, summary, "policy")
            if until == "promotion":
                summary["promotion"] = decision = promote(config, ingested, policy, str(project))
                mlflow.set_tag("dreamgym.promotion", "promoted" if decision["promoted"] else "rejected")
                write_stage_metrics(project, config, summary, "promotion")
            mlflow.log_metrics(stage_metrics(summary))
            mlflow.log_text(json.dumps(summary, indent=2, default=str), "summary.json")
            create_markdown_artifact(
                key="pipeline-summary",
                description="What the pipeline run produced",
                markdown=markdown_table("dreamgym pipeline", pipeline_rows(summary)),
            )
            return summary


def stage_metrics(summary: dict, stage: str | None = None) -> dict[str, float]:
    """The headline figures of the stages in `summary` (or of one `stage`): the parent run's
    metrics, and the metrics files of the DVC stages."""
    metrics: dict[str, float] = {}
    if "experience" in summary and stage in (None, "experience"):
        fidelity = summary["experience"]["fidelity"]
        metrics |= {
            f"fidelity_{key}": fidelity[key]
            for key in ("next_state_exact_match", "reward_accuracy", "done_accuracy", "parse_failure_rate")
        }
    if "policy" in summary and stage in (None, "policy"):
        policy = summary["policy"]
        metrics |= {f"eval_{e['name']}_success_rate": e["success_rate"] for e in policy["evaluations"]}
        metrics |= {
            "real_transitions": policy["rl"]["real_transitions"],
            "synthetic_transitions": policy["rl"]["synthetic_transitions"],
        }
    if "promotion" in summary and stage in (None, "promotion"):
        metrics |= {"promotion_promoted": float(summary["promotion"]["promoted"])}
    return metrics


def pipeline_rows(summary: dict) -> list[tuple[str, str]]:
    """The pipeline's result as (label, value) rows: for the CLI's table and the Prefect artifact."""
    rows = summary_rows(summary["ingest"])
    if "experience" in summary:
        rows += experience_rows(summary["experience"])
    if "policy" in summary:
        rows += policy_rows(summary["policy"])
    if "promotion" in summary:
        rows += promotion_rows(summary["promotion"])
    return [*rows, ("MLflow run (pipeline)", summary["mlflow_run_id"])]
