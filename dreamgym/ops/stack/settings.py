"""The team stack's settings: one env file (infra/.env, from infra/.env.example) read by both the
Compose file and `dreamgym stack`, so the two deployments cannot disagree on ports or passwords.

Passwords are held as `Secret`s: they print as `***`, so a settings object in a log, an
exception or an MLflow param shows no password.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from dreamgym.errors import DreamgymError

EXAMPLE_ENV = "infra/.env.example"
PLACEHOLDER_PASSWORD = "change-me"  # what .env.example ships; refused as a real password


class StackConfigError(DreamgymError):
    """The stack's env file is missing, incomplete or holds a bad value."""


class Secret:
    """A password that never shows itself in repr() or str() (f-strings, logs, tracebacks)."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


@dataclass(frozen=True)
class StackSettings:
    """Ports and credentials of the shared services. Field names are the env file's keys, lower case."""

    postgres_password: Secret  # the superuser: only `stack up` uses it, to create roles and databases
    dreamgym_db_password: Secret  # the pipeline's role (no superuser)
    mlflow_db_password: Secret
    prefect_db_password: Secret
    postgres_port: int = 5432
    mlflow_port: int = 5000
    prefect_port: int = 4200
    ray_port: int = 6379
    ray_client_port: int = 10001
    host: str = "127.0.0.1"
    work_pool: str = "dreamgym-local"

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            key = field.name.upper()
            if field.name.endswith("_password"):
                if not value.value:
                    raise StackConfigError(f"{key} is empty: set a password of your own in the env file")
                if value.value == PLACEHOLDER_PASSWORD:
                    raise StackConfigError(
                        f"{key} is still {PLACEHOLDER_PASSWORD!r} from {EXAMPLE_ENV}: set a password of your own"
                    )
            elif field.name.endswith("_port") and not 1 <= value <= 65535:
                raise StackConfigError(f"{key}={value} is not a port: use a number from 1 to 65535")
        ports = [getattr(self, f.name) for f in fields(self) if f.name.endswith("_port")]
        if len(set(ports)) != len(ports):
            raise StackConfigError(f"the env file gives two services one port ({ports}): give each its own")


def load_settings(env_file: str | Path) -> StackSettings:
    """Read the env file; a missing key takes its default, a missing password is an error."""
    from dotenv import dotenv_values

    path = Path(env_file)
    if not path.is_file():
        raise StackConfigError(
            f"no env file at {path}: copy {EXAMPLE_ENV} to {path} and set its passwords (it is not committed)"
        )
    values = {key.lower(): value for key, value in dotenv_values(path).items() if value is not None}
    kwargs: dict[str, object] = {}
    for name in (field.name for field in fields(StackSettings)):
        if name not in values:
            if name.endswith("_password"):
                raise StackConfigError(f"{path}: {name.upper()} is not set; set it (see {EXAMPLE_ENV})")
            continue
        raw = values[name]
        if name.endswith("_password"):
            kwargs[name] = Secret(raw)
        elif name.endswith("_port"):
            try:
                kwargs[name] = int(raw)
            except ValueError:
                raise StackConfigError(f"{path}: {name.upper()}={raw!r} is not a port number") from None
        else:
            kwargs[name] = raw
    return StackSettings(**kwargs)
