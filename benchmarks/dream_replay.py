"""Does the dream give a policy's real episodes the outcome the game gave them?

RL in DreamEnv learns from the experience model's verdict on whole episodes (rl.reward: outcome):
an episode the game would call won but the dream calls lost is a push *away* from what works. This
replays real episodes of a policy (the per-episode table `dreamgym eval --json` writes beside its
report) action by action in the real game and in DreamEnv side by side, from the same first state,
and says for each episode

- the real outcome and the dream's (won, lost, or not ended within the real episode's steps);
- the first step where the two part: the dream does not offer the action the policy took (the
  replay of that episode stops there: the policy in the dream could not have taken it), the
  prediction failed to parse, a reward or an end that differs, or only the next state.

    .venv/bin/python benchmarks/dream_replay.py --project /tmp/run \
        --experience /tmp/run/outputs/experience/model-*/model \
        --episodes /tmp/run/outputs/policy/eval-bc-*.episodes.csv --games /tmp/run/data/games/train \
        --json benchmarks/results/dream-replay.json

The project folder gives params.yaml and the run directory (the buffer the model retrieves from).
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import Counter
from pathlib import Path

from dreamgym.config import load_config
from dreamgym.envs.base import Task
from dreamgym.envs.dream_env import DreamEnv, step_together
from dreamgym.envs.textworld_env import TextWorldEnv, load_task
from dreamgym.evaluation import ACTION_SEPARATOR
from dreamgym.experience.generate import open_experience_model
from dreamgym.state import parse_state


def read_episodes(path: Path) -> list[dict]:
    with path.open() as file:
        return [
            {"game": row["game"], "won": row["won"] == "True", "actions": row["actions"].split(ACTION_SEPARATOR)}
            for row in csv.DictReader(file)
        ]


def real_replay(game: Path, actions: list[str]) -> tuple[Task, list[tuple[str, float, bool]]]:
    """The game's task with its first state, and (next state, reward, terminated) per action."""
    env = TextWorldEnv(max_steps=len(actions) + 1)
    try:
        task = load_task(game)
        first, _ = env.reset(task)
        steps = []
        for action in actions:
            state, reward, terminated, _, _ = env.step(action)
            steps.append((state, reward, terminated))
            if terminated:
                break
        return Task(task.task_id, task.instruction, task.env, initial_state=first), steps
    finally:
        env.close()


def first_difference(dream: tuple, real: tuple) -> str | None:
    (d_state, d_reward, d_done), (r_state, r_reward, r_done) = dream, real
    if d_reward != r_reward:
        return "reward"
    if d_done != r_done:
        return "end"
    if parse_state(d_state) != parse_state(r_state):
        return "next state"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--experience", type=Path, required=True)
    parser.add_argument("--episodes", type=Path, required=True)
    parser.add_argument("--games", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()

    config = load_config(args.project / "params.yaml")
    episodes = read_episodes(args.episodes)
    replays = [real_replay(args.games / episode["game"], episode["actions"]) for episode in episodes]
    records = []
    with open_experience_model(args.experience, args.project / config.paths.run_dir, config) as model:
        envs = [DreamEnv(model, max_steps=len(steps) + 1, record=False) for _, steps in replays]
        states = [env.reset(task)[0] for env, (task, _) in zip(envs, replays, strict=True)]
        results: list[dict] = [{"dream": "not ended", "first_difference": None, "at_step": None} for _ in envs]
        for t in range(max(len(steps) for _, steps in replays)):
            active = []
            for i, (episode, (_, steps)) in enumerate(zip(episodes, replays, strict=True)):
                if t >= len(steps) or results[i]["dream"] != "not ended" or results[i].get("stopped"):
                    continue
                action = episode["actions"][t]
                if action not in parse_state(states[i]).actions:
                    results[i].update(stopped=True, dream="action not offered")
                    if results[i]["first_difference"] is None:
                        results[i].update(first_difference="action not offered", at_step=t)
                    continue
                active.append(i)
            if not active:
                continue
            before = list(states)
            stepped = step_together([envs[i] for i in active], [episodes[i]["actions"][t] for i in active])
            for i, (state, reward, terminated, _, info) in zip(active, stepped, strict=True):
                states[i] = state
                real = replays[i][1][t]
                if info["model_failure"]:
                    difference = "parse failure"
                else:
                    difference = first_difference((state, reward, terminated), real)
                if difference and results[i]["first_difference"] is None:
                    results[i].update(
                        first_difference=difference,
                        at_step=t,
                        action=episodes[i]["actions"][t],
                        before=before[i],
                        dream_next=state,
                        real_next=real[0],
                    )
                if terminated:
                    results[i]["dream"] = "won" if info["won"] else "lost"
        for episode, (_, steps), result in zip(episodes, replays, results, strict=True):
            result.pop("stopped", None)
            records.append(
                {"game": episode["game"], "real": "won" if episode["won"] else "lost", "steps": len(steps), **result}
            )
    outcomes = Counter(f"real {record['real']}, dream {record['dream']}" for record in records)
    won_differences = Counter(
        str(record["first_difference"]) for record in records if record["real"] == "won" and record["dream"] != "won"
    )
    summary = {
        "episodes": len(records),
        "outcomes": dict(outcomes.most_common()),
        "real_won_dream_not_first_difference": dict(won_differences.most_common()),
        "no_difference": sum(record["first_difference"] is None for record in records),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"summary": summary, "episodes": records}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
