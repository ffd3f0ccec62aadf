"""The RL epoch loop shared by GRPO and PPO, in any environment that passes `check_env`.

Each epoch: the curriculum draws tasks; every task is played by `group_size` rollouts side by
side (with `deny_lost_moves`, in waves: `rollout.play_groups`); the curriculum records their
outcomes; the algorithm turns episodes into samples (advantages); `update_epochs` shuffled passes
of minibatch gradient steps follow. Then metrics, and a checkpoint.

A run lives in one output directory:

    output_dir/run.json              what the run is (settings, seed, start policy, tasks)
    output_dir/epochs/epoch-<n>/     policy, optimizer.pt, state.json (written last)
    output_dir/policy/               the final policy, and result.json written last

A killed run started again continues after the last complete epoch (policy, optimizer,
curriculum, history and real-transition count restored). Every epoch's sampling uses a generator
seeded by (seed, epoch), so a resumed run takes the same decisions as an uninterrupted one; a
finished run is returned as it is (`reused`). A directory holding a different run is refused.

Real-environment runs count every real transition; `real_budget` stops a run: the episodes
running when it is spent are cut and not learned from, and no further epoch starts. Near its end
an epoch plays only the groups the rest of the budget likely finishes (at the run's last mean
episode length, `config.max_steps` before one is known), so a budget smaller than one epoch still
teaches. Synthetic transitions are cheap: `config.synthetic_budget` only stops a DreamEnv run
between epochs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from dreamgym.config import config_to_dict
from dreamgym.curriculum import Curriculum
from dreamgym.envs.base import Env, Task
from dreamgym.envs.dream_env import DreamEnv
from dreamgym.errors import DreamgymError
from dreamgym.lm.model import deterministic_kernels
from dreamgym.lm.sft import claim_run_directory, progress_bars
from dreamgym.policy.model import Policy, load_policy
from dreamgym.rl.common import Sample
from dreamgym.rl.config import RLConfig
from dreamgym.rl.grpo import GRPO
from dreamgym.rl.monitor import RealCheck, gap_metrics, gap_warning
from dreamgym.rl.ppo import PPO
from dreamgym.rl.rollout import Episode, RealBudget, play_groups

logger = logging.getLogger("dreamgym.rl")

RESULT_FILE = "result.json"
STATE_FILE = "state.json"
KEEP_EPOCHS = 2
# An epoch whose mean policy entropy falls below this (nats) has all but stopped exploring.
ENTROPY_FLOOR = 0.05


@dataclasses.dataclass(frozen=True)
class RLResult:
    policy_dir: Path
    history: list[dict[str, float]]  # one row of metrics per epoch
    real_transitions: int
    synthetic_transitions: int  # DreamEnv's steps: predicted by the model or recalled
    seconds: float
    recalled_transitions: int = 0  # of the synthetic ones, those answered with a recorded real outcome
    resumed_from: int | None = None  # the epoch training continued after
    reused: bool = False

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "policy_dir": str(self.policy_dir)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> RLResult:
        values = json.loads(text)
        return cls(**{**values, "policy_dir": Path(values["policy_dir"])})


def make_algorithm(config: RLConfig) -> GRPO | PPO:
    return GRPO(config) if config.algorithm == "grpo" else PPO(config)


def collapse_warnings(history: Sequence[dict[str, float]]) -> list[str]:
    """Warnings about the known failures of agent RL, from the metrics so far: the policy's
    entropy collapsing (it stopped exploring) or its success falling to nothing after it had some."""
    if not history:
        return []
    last, messages = history[-1], []
    if last.get("entropy", 1.0) < ENTROPY_FLOOR:
        messages.append(
            f"epoch {last['epoch']}: policy entropy collapsed to {last['entropy']:.3f} nats "
            "(it no longer explores); raise rl.entropy_coef or rl.kl_coef, or lower the learning rate"
        )
    rates = [row["success_rate"] for row in history if "success_rate" in row]  # absent: a partial epoch
    if last.get("success_rate") == 0 and max(rates) > 0:
        messages.append(
            f"epoch {last['epoch']}: success rate collapsed to 0 after reaching {max(rates):.2f}; "
            "lower rl.learning_rate or raise rl.kl_coef"
        )
    return messages


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _progress_unit(config: RLConfig, real_budget: int | None) -> tuple[int, str]:
    """What a run's progress bar counts, and to what total: the budget that ends it, else epochs."""
    if real_budget is not None:
        return real_budget, "real"
    if config.synthetic_budget:
        return config.synthetic_budget, "synthetic"
    return config.epochs, "epoch"


def _recalled_steps(envs: Sequence[Env]) -> int:
    """DreamEnv steps the slots' environments answered with a recorded real outcome, so far."""
    return sum(env.recalled_steps for env in envs if isinstance(env, DreamEnv))


def _policy_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        if file.is_file() and file.name != RESULT_FILE:
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _claim(output_dir: Path, identity: dict[str, Any]) -> None:
    """Record which RL run the directory holds, or refuse if it holds another one."""
    recorded = claim_run_directory(output_dir, identity)
    if recorded is not None:
        changed = sorted(key for key in identity if recorded.get(key) != identity[key])
        raise DreamgymError(
            f"{output_dir} holds an RL run with different {', '.join(changed)}; use "
            "another output directory or delete it to start afresh"
        )


def _epoch_dirs(output_dir: Path) -> list[Path]:
    """Complete epoch checkpoints (state.json is written last), oldest first."""
    dirs = [path for path in (output_dir / "epochs").glob("epoch-*") if (path / STATE_FILE).is_file()]
    return sorted(dirs, key=lambda path: int(path.name.removeprefix("epoch-")))


def _save_epoch(
    output_dir: Path, epoch: int, policy: Policy, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    target = output_dir / "epochs" / f"epoch-{epoch}"
    shutil.rmtree(target, ignore_errors=True)
    policy.save(target / "policy")
    torch.save(optimizer.state_dict(), target / "optimizer.pt")
    (target / STATE_FILE).write_text(json.dumps(state))
    for old in _epoch_dirs(output_dir)[:-KEEP_EPOCHS]:
        shutil.rmtree(old, ignore_errors=True)


def _minibatches(samples: list[Sample], size: int, rng: random.Random) -> list[list[Sample]]:
    order = list(range(len(samples)))
    rng.shuffle(order)
    return [[samples[i] for i in order[start : start + size]] for start in range(0, len(order), size)]


def _update(
    policy: Policy,
    reference: Policy | None,
    algorithm: GRPO | PPO,
    samples: list[Sample],
    optimizer: torch.optim.Optimizer,
    config: RLConfig,
    rng: random.Random,
) -> dict[str, float]:
    """`update_epochs` passes of minibatch steps; the mean of each metric over the steps."""
    totals: dict[str, float] = {}
    steps = 0
    policy.train()
    parameters = [p for p in policy.parameters() if p.requires_grad]
    for _ in range(config.update_epochs):
        for batch in _minibatches(samples, config.minibatch_size, rng):
            loss, metrics = algorithm.loss(policy, reference, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(parameters, config.max_grad_norm))
            optimizer.step()
            metrics["loss"] = loss.item()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value
            steps += 1
    policy.eval()
    return {key: value / steps for key, value in totals.items()} if steps else {}


def _episode_steps(history: Sequence[dict[str, float]], config: RLConfig) -> float:
    """The run's latest mean episode length (from its last whole epoch), else the most one may take."""
    known = [metrics["steps_mean"] for metrics in history if "steps_mean" in metrics]
    return known[-1] if known else float(config.max_steps)


def episode_metrics(episodes: Sequence[Episode], reward: str) -> dict[str, float]:
    """The epoch's outcomes (success, return, steps) over its episodes. Where the real budget cut
    some of them, the epoch is partial and its outcomes are left out: the episodes that finished
    are the ones that ended first, the short ones, and a rate over them is no epoch's success (a
    bench's real GRPO seemed to collapse on such an epoch; measured: results log, 2026-11-27).
    Where it cut them all, nothing finished either. Left out, not 0: 0 would read as
    a collapse."""
    finished = [episode for episode in episodes if not episode.cut]
    metrics = {
        "episodes": float(len(finished)),
        "model_failures": float(sum(sum(episode.model_failures) for episode in episodes)),
        "cut_episodes": float(len(episodes) - len(finished)),
    }
    if finished and len(finished) == len(episodes):
        metrics |= {
            "success_rate": sum(episode.won for episode in finished) / len(finished),
            "return_mean": sum(episode.episode_return(reward) for episode in finished) / len(finished),
            "steps_mean": sum(episode.steps for episode in finished) / len(finished),
        }
    return metrics


def train_rl(
    start_policy: str | Path,
    make_env: Callable[[int], Env],
    curriculum: Curriculum,
    config: RLConfig,
    output_dir: str | Path,
    seed: int,
    *,
    real_budget: int | None = None,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    on_transitions: Callable[[list[dict]], None] | None = None,
    real_check: RealCheck | None = None,
    progress: bool = True,
) -> RLResult:
    """Train the policy saved at `start_policy` (also the KL reference) by `config.algorithm`.

    `make_env(slot)` builds the environment of one rollout slot (slots are reused every epoch);
    `curriculum` draws each epoch's tasks (its state is checkpointed); `real_budget` caps the real
    transitions (None: no cap, for synthetic environments). `on_epoch` gets each epoch's metrics
    (e.g. to log them); `on_transitions` gets DreamEnv's synthetic transitions (the write-back);
    `real_check` plays the tasks of every `config.real_check_every`-th epoch in their real games
    too, for the dream-vs-real gap (`dreamgym.rl.monitor`; measured, never learned from).
    """
    with progress_bars(False):  # transformers' bars on every checkpoint save and load are noise here
        try:
            return _train_rl(
                Path(start_policy),
                make_env,
                curriculum,
                config,
                Path(output_dir),
                seed,
                real_budget,
                on_epoch,
                on_transitions,
                real_check,
                progress,
            )
        finally:
            if real_check is not None:
                real_check.close()


def _train_rl(
    start_policy: Path,
    make_env: Callable[[int], Env],
    curriculum: Curriculum,
    config: RLConfig,
    output_dir: Path,
    seed: int,
    real_budget: int | None,
    on_epoch: Callable[[dict[str, float]], None] | None,
    on_transitions: Callable[[list[dict]], None] | None,
    real_check: RealCheck | None,
    progress: bool,
) -> RLResult:
    started = time.perf_counter()
    deterministic_kernels()
    identity = {
        "settings": config_to_dict(config),
        "seed": seed,
        "start_policy": _policy_digest(start_policy),
        "real_budget": real_budget,
        "tasks": _digest(json.dumps(sorted(task.task_id for task in curriculum.seeds))),
    }
    _claim(output_dir, identity)
    if (output_dir / "policy" / RESULT_FILE).is_file():
        result = RLResult.from_json((output_dir / "policy" / RESULT_FILE).read_text())
        return dataclasses.replace(result, policy_dir=output_dir / "policy", reused=True)

    algorithm = make_algorithm(config)
    reference = load_policy(start_policy) if config.kl_coef > 0 else None
    checkpoints = _epoch_dirs(output_dir)
    resumed_from = None
    history: list[dict[str, float]] = []
    budget = RealBudget(real_budget)
    synthetic = recalled = 0
    if checkpoints:
        last = checkpoints[-1]
        state = json.loads((last / STATE_FILE).read_text())
        policy = load_policy(last / "policy", train=True)
        history, budget.used, synthetic = state["history"], state["real_transitions"], state["synthetic_transitions"]
        recalled = state.get("recalled_transitions", 0)
        curriculum = Curriculum.from_state_dict(
            state["curriculum"],
            curriculum.seeds,
            curriculum.config,
            curriculum.write_variations,
            curriculum.known_verbs,
        )
        resumed_from = state["epoch"]
    else:
        policy = load_policy(start_policy, train=True)
    if algorithm.uses_values:
        policy.add_value_head(seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.learning_rate)
    if checkpoints:
        optimizer.load_state_dict(torch.load(checkpoints[-1] / "optimizer.pt"))

    envs: list[Env] = []

    def slot_envs(count: int) -> list[Env]:
        """The first `count` rollout slots' environments (built once, reused every epoch)."""
        while len(envs) < count:
            envs.append(make_env(len(envs)))
        return envs[:count]

    first_epoch = 0 if resumed_from is None else resumed_from + 1
    # A run that a budget ends shows the budget's progress (the epoch count is only a ceiling there).
    total, unit = _progress_unit(config, real_budget)

    def counted() -> int:
        return min(total, {"real": budget.used, "synthetic": synthetic, "epoch": len(history)}[unit])

    with tqdm(
        total=total,
        initial=counted(),
        desc=f"{config.algorithm} ({unit})",
        unit="epoch" if unit == "epoch" else "transition",
        disable=not progress,
    ) as bar:
        for epoch in range(first_epoch, config.epochs):
            if budget.exhausted:
                logger.info("real budget of %s transitions spent; stopping before epoch %s", real_budget, epoch)
                break
            if 0 < config.synthetic_budget <= synthetic:
                logger.info(
                    "synthetic budget of %s transitions spent (%s taken); stopping before epoch %s",
                    config.synthetic_budget,
                    synthetic,
                    epoch,
                )
                break
            epoch_started = time.perf_counter()
            recalled_before = _recalled_steps(envs)
            tasks: list[Task] = curriculum.draw(epoch)
            # Side by side, a budget shorter than the epoch cut every episode: sim-to-real's 100
            # real transitions over 8 groups of 4 learnt from none (bench, 2026-12-06).
            tasks = tasks[: budget.groups_that_fit(len(tasks), config.group_size, _episode_steps(history, config))]
            episodes = play_groups(
                policy,
                slot_envs,
                tasks,
                config.group_size,
                deny_lost_moves=config.deny_lost_moves,
                generator=torch.Generator().manual_seed(seed * 100_003 + epoch),
                temperature=config.temperature,
                budget=budget,
                with_values=algorithm.uses_values,
            )
            for task in tasks:
                group = [e for e in episodes if e.task.task_id == task.task_id and not e.cut]
                if group:
                    curriculum.record(
                        task.task_id, [e.episode_return(config.reward) for e in group], [e.won for e in group]
                    )
            rows = [row for env in envs if isinstance(env, DreamEnv) for row in env.take_transitions()]
            dreamt = sum(1 for e in episodes if not e.real for _ in e.decisions)
            recalled_now = _recalled_steps(envs) - recalled_before
            synthetic, recalled = synthetic + dreamt, recalled + recalled_now
            if rows and on_transitions is not None:
                on_transitions(rows)
            checks_now = real_check is not None and config.real_check_every and epoch % config.real_check_every == 0
            checked = gap_metrics(episodes, real_check(policy, tasks, epoch)) if checks_now else {}
            samples = algorithm.samples(episodes, policy)
            update = _update(
                policy, reference, algorithm, samples, optimizer, config, random.Random(seed * 100_003 + epoch)
            )
            metrics = {
                "epoch": float(epoch),
                **episode_metrics(episodes, config.reward),
                **update,
                "samples": float(len(samples)),
                "real_transitions": float(budget.used),
                "synthetic_transitions": float(synthetic),
                "recalled_transitions": float(recalled),
                # the epoch's DreamEnv steps answered with a recorded real outcome (rl.recall_real)
                **({"recalled_share": recalled_now / dreamt} if dreamt else {}),
                **checked,
                **curriculum.metrics(),
                "epoch_seconds": time.perf_counter() - epoch_started,
            }
            history.append(metrics)
            for message in [*collapse_warnings(history), gap_warning(metrics)]:
                if message:
                    logger.warning(message)
            _save_epoch(
                output_dir,
                epoch,
                policy,
                optimizer,
                {
                    "epoch": epoch,
                    "history": history,
                    "real_transitions": budget.used,
                    "synthetic_transitions": synthetic,
                    "recalled_transitions": recalled,
                    "curriculum": curriculum.state_dict(),
                },
            )
            if on_epoch is not None:
                on_epoch(metrics)
            bar.set_postfix(
                success=f"{metrics.get('success_rate', float('nan')):.2f}", loss=f"{metrics.get('loss', 0):.3f}"
            )
            bar.update(counted() - bar.n)
    for env in envs:
        env.close()

    final = output_dir / "policy"
    policy.save(final)
    result = RLResult(
        policy_dir=final,
        history=history,
        real_transitions=budget.used,
        synthetic_transitions=synthetic,
        seconds=time.perf_counter() - started,
        recalled_transitions=recalled,
        resumed_from=resumed_from,
    )
    partial = final / f".{RESULT_FILE}.partial"
    partial.write_text(result.to_json())
    partial.replace(final / RESULT_FILE)
    return result
