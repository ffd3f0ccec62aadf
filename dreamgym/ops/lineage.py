"""Where a registered model came from: walk MLflow back from a model version to the data.

policy version → the run that trained it → the experience model version it trained in → that
model's run → the ingest run and the dataset (DVC md5) → the pipeline run holding the full
resolved config and the git commit. Each link is read from what the flows record: a version's
`run_id`, and the run tags `dreamgym.experience_model`, `dreamgym.ingest_run_id`,
`dreamgym.data_md5`, `git_commit` and MLflow's own `mlflow.parentRunId`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dreamgym.ops.registry import RegistryError, model_version


@dataclass(frozen=True)
class Link:
    """One step of the chain: what it is, and the facts recorded for it."""

    kind: str  # policy | experience-model | data | pipeline
    label: str
    facts: dict[str, str] = field(default_factory=dict)


def _version_link(client, version, kind: str) -> tuple[Link, object]:
    run = client.get_run(version.run_id)
    tags = run.data.tags
    facts = {
        "run": version.run_id,
        "stage": tags.get("dreamgym.stage", "?"),
        "git_commit": tags.get("git_commit", "?"),
        "data_md5": tags.get("dreamgym.data_md5", "?"),
    }
    aliases = getattr(version, "aliases", None) or []
    if aliases:
        facts["aliases"] = ", ".join(sorted(aliases))
    for key in ("success_rate", "real_transitions", "rl", "promotion.decision", "promotion.reason"):
        if key in version.tags:
            facts[key] = version.tags[key]
    for key in ("fidelity_next_state_exact_match", "eval_dreamgym_success_rate"):
        if key in run.data.metrics:
            facts[key] = f"{run.data.metrics[key]:.4f}"
    return Link(kind, f"models:/{version.name}/{version.version}", facts), run


def lineage(reference: str) -> list[Link]:
    """The chain behind a registered model version, newest first."""
    import mlflow  # slow import

    client = mlflow.MlflowClient()
    version = model_version(client, reference)
    link, run = _version_link(client, version, "policy" if "policy" in version.name else "model")
    links = [link]
    consumed = run.data.tags.get("dreamgym.experience_model")
    if consumed and consumed.startswith("models:/"):
        experience, experience_run = _version_link(client, model_version(client, consumed), "experience-model")
        links.append(experience)
    else:
        experience_run = run
    ingest_id = run.data.tags.get("dreamgym.ingest_run_id") or experience_run.data.tags.get("dreamgym.ingest_run_id")
    if ingest_id:
        ingest = client.get_run(ingest_id)
        facts = {"run": ingest_id, "md5": ingest.data.tags.get("dreamgym.data_md5", "?")}
        for dataset_input in ingest.inputs.dataset_inputs:
            facts["dataset"] = f"{dataset_input.dataset.name} (digest {dataset_input.dataset.digest})"
            facts["source"] = dataset_input.dataset.source
        for key in ("collect_transitions", "collect_trajectories", "train_games", "test_games"):
            if key in ingest.data.metrics:
                facts[key] = f"{ingest.data.metrics[key]:g}"
        links.append(Link("data", f"DVC md5 {facts['md5']}", facts))
    parent_id = run.data.tags.get("mlflow.parentRunId")
    if parent_id:
        parent = client.get_run(parent_id)
        facts = {
            "run": parent_id,
            "git_commit": parent.data.tags.get("git_commit", "?"),
            "prefect_flow_run": parent.data.tags.get("prefect.flow_run_id", "?"),
            "parameters": str(len(parent.data.params)),
            "config": f"mlflow artifacts download -r {parent_id} -a config/params.json",
        }
        links.append(Link("pipeline", f"pipeline run {parent.info.run_name}", facts))
    if len(links) == 1:
        raise RegistryError(
            f"{reference}: its run records no experience model, data or pipeline run; "
            "was it registered by the pipeline (dreamgym run)?"
        )
    return links


def as_json(links: list[Link]) -> str:
    """The chain as `dreamgym lineage --json` prints it."""
    import json

    return json.dumps([{"kind": link.kind, "label": link.label, **link.facts} for link in links], indent=2)


def as_tree(links: list[Link]):
    """The chain as the rich tree `dreamgym lineage` prints: each link under the one before."""
    from rich.tree import Tree

    root = node = Tree(f"{links[0].kind}: {links[0].label}")
    for index, link in enumerate(links):
        if index:
            node = node.add(f"{link.kind}: {link.label}")
        for key, value in link.facts.items():
            node.add(f"{key}: {value}")
    return root
