"""The sections of `params.yaml` that run and judge the pipeline's work: real held-out evaluation
(`dreamgym/evaluation.py`), the promotion gate (`dreamgym/ops/promotion.py`) and where the work that fans
out runs (`dreamgym/ops/fanout.py`, `flows/compute.py`)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import field_validator
from pydantic.dataclasses import dataclass

from dreamgym.sections import STRICT, described


@dataclass(config=STRICT)
class EvaluationConfig:
    """Real-environment evaluation of policies on the held-out (test split) games."""

    games: Annotated[int, described("Test-split games evaluated (0: all of them).", ge=0)] = 40
    train_games: Annotated[
        int,
        described(
            "Training games on which BC and the final policy are also played, so that the "
            "generalisation gap (training games vs held-out) is always shown (0: none).",
            ge=0,
        ),
    ] = 40
    episodes_per_game: Annotated[
        int, described("Episodes per game (greedy episodes repeat exactly; more only help when sampling).", ge=1)
    ] = 1
    max_steps: Annotated[int, described("Steps before an evaluation episode is truncated.", ge=1, le=1000)] = 50
    greedy: Annotated[bool, described("Take the most likely action (else sample, seeded).")] = True


@dataclass(config=STRICT)
class PromotionConfig:
    """The gate a new policy version passes to become `champion` (dreamgym/ops/promotion.py)."""

    margin: Annotated[
        float,
        described(
            "Success-rate points (0-1) the challenger must beat the champion (or BC, for the first version) by.",
            ge=0.0,
            le=1.0,
        ),
    ] = 0.0
    alpha: Annotated[
        float,
        described(
            "Significance level of the one-sided test that the challenger wins more often (paired on the same "
            "episodes when both recorded their outcomes, else two-proportion).",
            gt=0.0,
            lt=1.0,
        ),
    ] = 0.05


@dataclass(config=STRICT)
class BenchConfig:
    """The targets `dreamgym bench` checks its rows against (dreamgym/ops/benchmark.py): each preset
    states its benchmark's own. The paper's claims in kind (DreamGym >= real GRPO at N, sim-to-real,
    the ablations) are checked on every preset."""

    bc_at_most: Annotated[
        float | None,
        described(
            "BC's held-out success at most this (0-1): the games leave room to learn; null: not a target.", ge=0, le=1
        ),
    ] = 0.6
    bc_at_least: Annotated[
        float | None,
        described("BC's held-out success at least this (0-1): the agent acts; null: not a target.", ge=0, le=1),
    ] = None
    dream_gain: Annotated[
        float,
        described("DreamGym (0 real transitions) at least this many success points (0-1) above BC.", ge=-1, le=1),
    ] = 0.1
    real_gain: Annotated[
        float | None,
        described(
            "Real-env GRPO at 10N at least this many success points (0-1) above BC (RL works); null: not a target.",
            ge=-1,
            le=1,
        ),
    ] = 0.1


# What `compute.ray_address` accepts: Ray's own address forms (ray.init's `address`).
_RAY_ADDRESS = re.compile(r"local|auto|(ray://)?[\w.-]+:\d{1,5}")


@dataclass(config=STRICT)
class ComputeConfig:
    """Where the work that fans out runs: game generation, offline and fidelity collection, real
    held-out evaluation (flows/compute.py). Either way the results are the same, record for record,
    so no cache key includes this section: a run on Ray reuses what a local run made, and back."""

    task_runner: Annotated[
        Literal["local", "ray"],
        described(
            "'local': in the flow's process, as games.workers and collect.workers say; 'ray': cut into "
            "pieces, each a Prefect task on a Ray cluster at ray_address (prefect-ray's RayTaskRunner). "
            "The environment variable DREAMGYM_RAY_ADDRESS, when set, means 'ray' at the address it "
            "holds, whatever this file says (Ray's own RAY_ADDRESS never switches the runner)."
        ),
    ] = "local"
    ray_address: Annotated[
        str,
        described(
            "task_runner ray: 'local' starts a Ray on this machine for the run, with ray_workers CPUs; "
            "'auto' joins the cluster `ray start` runs here (or the one RAY_ADDRESS names); "
            "'HOST:6379' the cluster whose head's GCS is there, from a machine of that cluster (the "
            "stack's client.env names this); 'ray://HOST:10001' its Ray Client port, from outside the "
            "cluster (Ray 2.60's client now and then fails to start: ray-project/ray#63202). A remote "
            "cluster's workers need the "
            "project installed, data_dir and outputs_dir on a shared filesystem at the same paths, and "
            "PREFECT_API_URL naming a Prefect server they can reach."
        ),
    ] = "local"
    ray_workers: Annotated[
        int,
        described(
            "CPUs of the Ray that ray_address 'local' starts: pieces run at once (a cluster's own CPUs "
            "count otherwise).",
            ge=1,
        ),
    ] = 2

    @field_validator("ray_address")
    @classmethod
    def _known_address(cls, value: str) -> str:
        if not _RAY_ADDRESS.fullmatch(value):
            raise ValueError("use 'local', 'auto', 'ray://HOST:PORT' (Ray Client, usually port 10001) or 'HOST:PORT'")
        return value
