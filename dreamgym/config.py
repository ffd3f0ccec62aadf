"""The pipeline's configuration, loaded from `params.yaml` (the one source of its parameters).

Each section of `params.yaml` is a frozen dataclass that lives beside the code it configures, with
help text on every field (`dreamgym.sections` says how they are declared):

    env, collect, validation          dreamgym/data/config.py
    buffer                            dreamgym/buffer/config.py
    experience                        dreamgym/experience/config.py
    policy                            dreamgym/policy/config.py
    rl, curriculum                    dreamgym/rl/config.py
    evaluation, promotion, compute    dreamgym/ops/config.py
    bench                             dreamgym/ops/config.py (the targets of `dreamgym bench`)
    games                             dreamgym/envs/textworld/config.py (TextWorld cooking's)
    scienceworld                      dreamgym/envs/scienceworld/config.py

`PipelineConfig` below composes them, with the top-level keys and `paths`. Values are validated
when loaded (types, ranges, unknown keys); an error names the key, the bad value and what to write
instead, e.g.

    params.yaml: collect.epsilon = 1.5: must be at most 1 (a probability); fix it in params.yaml
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from dreamgym.buffer.config import BufferConfig
from dreamgym.data.config import CollectConfig, EnvConfig, ValidationConfig
from dreamgym.envs.scienceworld.config import ScienceWorldConfig
from dreamgym.envs.textworld.config import MAX_SEED, GamesConfig
from dreamgym.errors import ConfigError
from dreamgym.experience.config import ExperienceConfig
from dreamgym.ops.config import BenchConfig, ComputeConfig, EvaluationConfig, PromotionConfig
from dreamgym.policy.config import PolicyConfig
from dreamgym.rl.config import CurriculumConfig, RLConfig
from dreamgym.sections import MEMORY_SIZE, STRICT, described


@dataclass(config=STRICT)
class PathsConfig:
    """Where things live, relative to the project directory unless absolute."""

    data_dir: Annotated[str, described("The versioned offline dataset (tracked by data.dvc).")] = "data"
    outputs_dir: Annotated[str, described("Derived outputs (validation reports, quarantine).")] = "outputs"
    run_dir: Annotated[str, described("Embedded services' state: MLflow (SQLite + artifacts), Prefect home.")] = (
        ".dreamgym"
    )


@dataclass(config=STRICT)
class PipelineConfig:
    """Everything the pipeline reads; `params.yaml` mirrors this structure."""

    seed: Annotated[
        int,
        described(
            f"Seed for game generation, collection and training (0 to {MAX_SEED}: game i "
            "of a split gets seed * 100000 + i, and tw-make takes seeds below 2**32).",
            ge=0,
            le=MAX_SEED,
        ),
    ] = 0
    experiment: Annotated[str, described("MLflow experiment name.", min_length=1)] = "dreamgym"
    paths: PathsConfig = dataclasses.field(default_factory=PathsConfig)
    games: GamesConfig = dataclasses.field(default_factory=GamesConfig)
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    collect: CollectConfig = dataclasses.field(default_factory=CollectConfig)
    validation: ValidationConfig = dataclasses.field(default_factory=ValidationConfig)
    buffer: BufferConfig = dataclasses.field(default_factory=BufferConfig)
    experience: ExperienceConfig = dataclasses.field(default_factory=ExperienceConfig)
    curriculum: CurriculumConfig = dataclasses.field(default_factory=CurriculumConfig)
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    rl: RLConfig = dataclasses.field(default_factory=RLConfig)
    evaluation: EvaluationConfig = dataclasses.field(default_factory=EvaluationConfig)
    promotion: PromotionConfig = dataclasses.field(default_factory=PromotionConfig)
    bench: BenchConfig = dataclasses.field(default_factory=BenchConfig)
    compute: ComputeConfig = dataclasses.field(default_factory=ComputeConfig)
    scienceworld: ScienceWorldConfig = dataclasses.field(default_factory=ScienceWorldConfig)

    def __post_init__(self) -> None:
        if self.env.name != "textworld":  # TextWorld cooking's rules and games do not apply
            wrong = [
                f"{key} is {value!r}, use {fix!r}"
                for key, value, fix in (
                    ("experience.domain", self.experience.domain, "none"),
                    ("policy.domain", self.policy.domain, "none"),
                    ("collect.domain", self.collect.domain, "none"),
                    ("games.target", self.games.target, "same"),
                )
                if value != fix
            ]
            if wrong:
                fixes = "; ".join(wrong)
                raise ValueError(f"env.name is {self.env.name!r}, but {fixes} (params-scienceworld.yaml has them all)")


# Keys an older params.yaml may still have (CHANGELOG.md): what to do about each, for its error.
OLD_KEYS = {
    "experience.constrain_removals": "is now called 'experience.constrained_decoding'; rename it",
    "experience.renamed_copies": "was removed (placeholders do that job, and it measured worse); delete it",
    "buffer.top_k": (
        "was removed (`dreamgym buffer query -k` sets it; the experience model uses experience.neighbours); delete it"
    ),
    "experience.examples_first": "was removed (decided: always off, as it was by default); delete it",
    "rl.step_weight": "was removed (GiGPO's step-level advantage: no gain, always 0 as by default); delete it",
}


def _format_error(error: dict[str, Any], source: str, overridden: frozenset[str]) -> str:
    key = ".".join(str(part) for part in error["loc"])
    value = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "string_pattern_mismatch" and error["ctx"]["pattern"] == MEMORY_SIZE:
        message = "must be a Postgres memory size: a whole number then kB, MB or GB, e.g. 512MB"
    if key in overridden:  # the CLI option is named after the key's last part
        return f"--{key.rsplit('.', 1)[-1].replace('_', '-')} {value!r}: {message}"
    if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        if key in OLD_KEYS:
            return f"{source}: '{key}' {OLD_KEYS[key]}"
        return f"{source}: unknown key '{key}'; remove it or check its spelling"
    if error["type"] == "missing":
        return f"{source}: '{key}' is required"
    if isinstance(value, dict):  # a check across a whole section (__post_init__)
        return f"{source}: {key or 'top level'}: {message}; fix it in {source}"
    return f"{source}: {key} = {value!r}: {message}; fix it in {source}"


def config_from_dict(
    values: dict[str, Any], source: str = "params.yaml", overridden: frozenset[str] = frozenset()
) -> PipelineConfig:
    """Validate a nested dict into a `PipelineConfig`; `ConfigError` lists every problem.

    `overridden` names the dotted keys that came from the command line, not from `source`.
    """
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(values).__name__}")
    try:
        return TypeAdapter(PipelineConfig).validate_python(values)
    except ValidationError as error:
        messages = [_format_error(item, source, overridden) for item in error.errors()]
        raise ConfigError("; ".join(messages)) from None


def load_config(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Read and validate `params.yaml`; `overrides` maps dotted keys to values (e.g. from a CLI)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"parameter file {path} does not exist; run from the project directory or pass --params")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    for dotted, value in (overrides or {}).items():
        section = values
        *parents, leaf = dotted.split(".")
        for parent in parents:
            section = section.setdefault(parent, {})
        section[leaf] = value
    return config_from_dict(values, source=str(path), overridden=frozenset(overrides or {}))


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain nested dict (lists instead of tuples), for YAML, JSON and MLflow params."""
    return TypeAdapter(type(config)).dump_python(config, mode="json")


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}: the form MLflow params take."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat
