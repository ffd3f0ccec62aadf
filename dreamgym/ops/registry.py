"""Models in the MLflow registry: register a trained model folder, and find one again by reference.

A model is the folder its trainer saved (weights, config, tokenizer), logged as the run's `model`
artifact and registered as a version whose source is that artifact. (MLflow 3's
`register_model("runs:/…")` only accepts models logged through a flavour's `log_model`; a plain
folder is registered with `create_model_version` instead.) A reference is a local folder, a
`models:/name/version` or `models:/name@alias` URI, or a bare registered name (its latest version).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from dreamgym.errors import DreamgymError

MODEL_KEY_TAG = "dreamgym.model_key"


class RegistryError(DreamgymError):
    """A model reference that names nothing usable."""


def find_version(name: str, key: str) -> str | None:
    """The version of `name` registered for the model identified by `key`, if any."""
    import mlflow

    for version in mlflow.MlflowClient().search_model_versions(f"name = '{name}'"):
        if version.tags.get(MODEL_KEY_TAG) == key:
            return version.version
    return None


def register_model_dir(
    model_dir: str | Path, name: str, key: str, tags: dict[str, str] | None = None, artifact_path: str = "model"
) -> str:
    """Log `model_dir` to the active run as `artifact_path` and register it under `name`; return the version.

    `key` identifies the model (what it was trained from and how); a model already registered
    with that key is not registered again, so a re-run pipeline does not pile up copies.
    """
    import mlflow  # slow import
    from mlflow.exceptions import MlflowException

    run = mlflow.active_run()
    if run is None:
        raise RegistryError("register_model_dir needs an active MLflow run")
    existing = find_version(name, key)
    if existing is not None:
        return existing
    mlflow.log_artifacts(str(model_dir), artifact_path=artifact_path)
    client = mlflow.MlflowClient()
    try:
        client.create_registered_model(name)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version = client.create_model_version(
        name,
        source=f"{run.info.artifact_uri}/{artifact_path}",
        run_id=run.info.run_id,
        tags={**(tags or {}), MODEL_KEY_TAG: key},
    )
    return version.version


def model_version(client, reference: str):
    """The registered version a `models:/name/version`, `models:/name@alias` or bare name (its
    latest version) reference names."""
    from mlflow.exceptions import MlflowException

    if reference.startswith("models:") and not reference.startswith("models:/"):
        raise RegistryError(
            f"{reference!r} is not a model URI: write models:/NAME/VERSION or models:/NAME@ALIAS "
            f"(e.g. models:/{reference.removeprefix('models:').strip('/')}@champion)"
        )
    body = reference.removeprefix("models:/")
    try:
        if "@" in body:
            name, alias = body.split("@", 1)
            return client.get_model_version_by_alias(name, alias)
        if "/" in body:
            name, number = body.split("/", 1)
            return client.get_model_version(name, number)
        versions = client.search_model_versions(f"name = '{body}'", order_by=["version_number DESC"], max_results=1)
    except MlflowException as error:
        raise RegistryError(
            f"model {reference!r} not found in the MLflow registry "
            f"({error.message}); name a registered version: models:/NAME/VERSION or "
            "models:/NAME@ALIAS"
        ) from None
    if not versions:
        names = sorted(model.name for model in client.search_registered_models())
        known = (
            f"registered models: {', '.join(names)}"
            if names
            else "nothing is registered yet: `dreamgym run` registers the experience model and the policy"
        )
        raise RegistryError(f"no registered versions of {body!r} ({known})")
    return versions[0]


def resolve_model(reference: str, cache_dir: str | Path) -> tuple[Path, str]:
    """A local folder for `reference`, and a label saying which model it is."""
    local = Path(reference)
    if local.is_dir():
        return local, str(local)
    import mlflow

    version = model_version(mlflow.MlflowClient(), reference)
    target = Path(cache_dir) / f"{version.name}-v{version.version}"
    if not (target / "config.json").is_file():  # downloaded whole into scratch, then moved in place
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            downloaded = mlflow.artifacts.download_artifacts(artifact_uri=version.source, dst_path=scratch)
            shutil.rmtree(target, ignore_errors=True)
            Path(downloaded).rename(target)
    return target, f"models:/{version.name}/{version.version}"
