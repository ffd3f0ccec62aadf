"""The whole pipeline as one Prefect flow: ingest → validate → upsert → experience SFT → fidelity →
RL in DreamEnv with the curriculum → real held-out evaluation → promotion gate.

Each stage is a sub-flow made of versioned tasks (flows/caching.py): an unchanged re-run is a
cache hit, and a changed parameter re-runs the tasks that read it and those downstream. Stages
pass typed results (`IngestResult`, `ExperienceResult`, `PolicyResult`) that hold IDs (DVC md5,
MLflow run ids, model versions) and paths, never large objects.

MLflow lineage: one parent run per pipeline run and a nested run per stage. Each records the full
resolved config, the git commit and the dataset (DVC md5) as its input; the parent also records
the model versions produced and the promotion decision. `dreamgym lineage` walks it back.

Run it with `dreamgym run` (embedded services set up first) or as the `nightly` deployment of
prefect.yaml (`dreamgym serve`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import mlflow
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

from dreamgym.config import PipelineConfig, config_to_dict, load_config
from dreamgym.data.versioning import commit_stage, dvc_stage_params
from dreamgym.errors import DreamgymError
from dreamgym.ops.preflight import check_servers
from dreamgym.ops.promotion import POLICY_MODEL_NAME, Decision, crown_first, gate, held_out_evaluator
from dreamgym.ops.tracking import configure_services, stage_run
from flows.caching import stage_key
from flows.compute import compute_settings, on_compute, ray_cluster
from flows.ingest import IngestResult, ingest, log_dataset, markdown_table
from flows.train_experience import ExperienceResult, train_experience
from flows.train_policy import PolicyResult, train_policy


@dataclass(frozen=True)
class Promotion:
    """The promotion stage: whether the new policy became the champion, why, and the gate's
    decision (None when no gate ran: the policy was not registered)."""

    promoted: bool
    reason: str
    decision: Decision | None = None

    def rows(self) -> list[tuple[str, str]]:
        return [("promotion", ("promoted to champion: " if self.promoted else "not promoted: ") + self.reason)]


@dataclass(frozen=True)
class PipelineResult:
    """Each stage's result, up to the stage the run stopped after (`until`)."""

    mlflow_run_id: str
    prefect_flow_run_id: str
    ingest: IngestResult
    experience: ExperienceResult | None = None
    policy: PolicyResult | None = None
    promotion: Promotion | None = None

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows: for the CLI's table and the Prefect artifact."""
        stages = (self.ingest, self.experience, self.policy, self.promotion)
        return [
            *(row for stage in stages if stage is not None for row in stage.rows()),
            ("MLflow run (pipeline)", self.mlflow_run_id),
        ]

    def metrics(self, stage: str | None = None) -> dict[str, float]:
        """The headline figures of the stages run (or of one `stage`): the parent run's metrics,
        and the metrics files of the DVC stages."""
        metrics: dict[str, float] = {}
        if self.experience is not None and stage in (None, "experience"):
            fidelity = self.experience.fidelity
            metrics |= {
                f"fidelity_{key}": fidelity[key]
                for key in ("next_state_exact_match", "reward_accuracy", "done_accuracy", "parse_failure_rate")
            }
        if self.policy is not None and stage in (None, "policy"):
            metrics |= {f"eval_{e['name']}_success_rate": e["success_rate"] for e in self.policy.evaluations}
            metrics |= {
                "real_transitions": self.policy.rl.real_transitions,
                "synthetic_transitions": self.policy.rl.synthetic_transitions,
            }
        if self.promotion is not None and stage in (None, "promotion"):
            metrics |= {"promotion_promoted": float(self.promotion.promoted)}
        return metrics


@task(name="promotion-gate", cache_key_fn=stage_key(sections=("promotion",), params=("name", "version")))
def promotion_task(name: str, version: str, config: PipelineConfig, project_dir: str) -> Decision:
    """The gate for a new version; its decision is final, so a re-run with the same challenger
    and gate settings is a cache hit that changes nothing. A champion measured on another
    held-out set is measured again on the current one."""
    decision = gate(name, version, config.promotion, evaluate=held_out_evaluator(config, project_dir))
    get_run_logger().info("promotion of %s/%s: %s", name, version, decision.reason)
    return decision


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


def write_stage_metrics(project: Path, config: PipelineConfig, result: PipelineResult, stage: str) -> None:
    """The stage's headline figures in `<outputs_dir>/metrics/<stage>.json` (dvc.yaml's metrics),
    and the stage recorded in dvc.lock when dvc.yaml defines it."""
    path = project / config.paths.outputs_dir / "metrics" / f"{stage}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result.metrics(stage), indent=2, sort_keys=True) + "\n"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    declared = dvc_stage_params(project, stage)
    if declared is not None:
        settings = config_to_dict(config)
        record_stage_task(str(project), stage, str(path), {key: settings[key] for key in declared})


@flow(name="promote")
def promote(config: PipelineConfig, ingested: IngestResult, policy: PolicyResult, project_dir: str = ".") -> Promotion:
    """The promotion stage: its own nested MLflow run holding the decision and its numbers."""
    project = Path(project_dir).resolve()
    model = policy.model
    if not model.startswith(f"models:/{POLICY_MODEL_NAME}/"):
        return Promotion(promoted=False, reason="the policy was not registered (register_model off)")
    version = model.rsplit("/", 1)[1]
    tags = {"dreamgym.data_md5": ingested.data_md5, "dreamgym.policy": model}
    with stage_run("promotion", config, project, tags=tags):
        log_dataset(ingested.validated_path, ingested.data_md5, ingested.dvc_file)
        if policy.bc_model is not None and crown_first(POLICY_MODEL_NAME, policy.bc_model.rsplit("/", 1)[1]):
            get_run_logger().info("no champion yet: %s (the BC policy) is the first", policy.bc_model)
        decision = promotion_task(POLICY_MODEL_NAME, version, config, str(project))
        mlflow.log_metrics(decision.metrics())
        mlflow.set_tags(decision.tags())
        promotion = Promotion(promoted=decision.promote, reason=decision.reason, decision=decision)
        create_markdown_artifact(
            key="promotion",
            description="Promotion gate of the new policy version",
            markdown=markdown_table("Promotion", promotion.rows()),
        )
        return promotion


STAGES = ("ingest", "experience", "policy", "promotion")


@flow(name="dreamgym-pipeline")
def pipeline(
    params: str = "params.yaml",
    overrides: dict[str, Any] | None = None,
    refresh: bool = False,
    until: str = "promotion",
) -> PipelineResult:
    """The pipeline on the configuration in `params` (with dotted-key `overrides`), from ingest
    through the stage `until` (the DVC stages run it stage by stage); `refresh` ignores cached
    task results and recomputes them. Returns each stage's result."""
    if until not in STAGES:
        raise DreamgymError(f"until={until!r} is not a stage; use one of {', '.join(STAGES)}")
    params_path = Path(params).resolve()
    config = load_config(params_path, overrides)
    project = params_path.parent
    run_dir = project / config.paths.run_dir
    configure_services(run_dir)  # a deployment's worker may not have; never overrides what is set
    check_servers()  # a deployment run on a worker: a server that is down fails it now, by name
    compute = compute_settings(config.compute)  # local, unless compute or DREAMGYM_RAY_ADDRESS says Ray
    with (
        temporary_settings({PREFECT_TASKS_REFRESH_CACHE: refresh}),
        ray_cluster(compute),  # one Ray for every stage (none when local)
        stage_run("pipeline", config, project, tags={"prefect.flow_run_id": str(flow_run.get_id())}) as run,
    ):
        mlflow.log_dict(config_to_dict(config), "config/params.json")

        result = PipelineResult(
            mlflow_run_id=run.info.run_id,
            prefect_flow_run_id=str(flow_run.get_id()),
            ingest=on_compute(ingest, compute)(config, str(project)),  # records its own DVC stage
        )
        ingested = result.ingest
        mlflow.set_tag("dreamgym.data_md5", ingested.data_md5)
        log_dataset(ingested.validated_path, ingested.data_md5, ingested.dvc_file)
        if STAGES.index(until) >= STAGES.index("experience"):
            experience = on_compute(train_experience, compute)(config, ingested, str(project))
            result = replace(result, experience=experience)
            mlflow.set_tag("dreamgym.experience_model", result.experience.model)
            write_stage_metrics(project, config, result, "experience")
        if STAGES.index(until) >= STAGES.index("policy"):
            policy = on_compute(train_policy, compute)(config, ingested, result.experience, str(project))
            result = replace(result, policy=policy)
            mlflow.set_tag("dreamgym.policy", result.policy.model)
            write_stage_metrics(project, config, result, "policy")
        if until == "promotion":
            result = replace(result, promotion=promote(config, ingested, result.policy, str(project)))
            mlflow.set_tag("dreamgym.promotion", "promoted" if result.promotion.promoted else "rejected")
            write_stage_metrics(project, config, result, "promotion")
        mlflow.log_metrics(result.metrics())
        mlflow.log_text(json.dumps(asdict(result), indent=2, default=str), "summary.json")
        create_markdown_artifact(
            key="pipeline-summary",
            description="What the pipeline run produced",
            markdown=markdown_table("dreamgym pipeline", result.rows()),
        )
        return result
