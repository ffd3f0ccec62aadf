"""`check_env`: the conformance test that every environment, real or synthetic, passes in CI.

It checks the contract of `dreamgym.envs.base`, not any one game's rules: types and shapes of
what `reset` and `step` return, observations in the abstract state format, the required `info`
keys, `terminated` and `truncated` kept apart and never both true, truncation exactly at
`max_steps`, a reproducible `reset`, an unknown action handled as a step rather than a crash,
and a clear error when stepping before `reset` or after the episode ended.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from dreamgym.envs.base import REQUIRED_INFO_KEYS, Env, EnvError, Task
from dreamgym.errors import DreamgymError
from dreamgym.state import StateParseError, parse_state

UNKNOWN_ACTION = "xyzzy the unknown verb"


class EnvCheckError(DreamgymError):
    """An environment breaks the contract; the message says which rule and where."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise EnvCheckError(message)


def _check_observation(observation: object, where: str) -> None:
    _require(isinstance(observation, str), f"{where}: observation must be text, got {type(observation).__name__}")
    try:
        parse_state(observation)
    except StateParseError as error:
        raise EnvCheckError(f"{where}: observation is not an abstract state ({error})") from None


def _check_info(info: object, where: str) -> None:
    _require(isinstance(info, dict), f"{where}: info must be a dict, got {type(info).__name__}")
    missing = [key for key in REQUIRED_INFO_KEYS if key not in info]
    _require(not missing, f"{where}: info lacks {', '.join(missing)}")
    _require(isinstance(info["won"], bool) and isinstance(info["lost"], bool), f"{where}: info won/lost must be bool")
    _require(
        isinstance(info["score"], int | float) and isinstance(info["max_score"], int | float),
        f"{where}: info score/max_score must be numbers",
    )
    _require(
        info["expert_action"] is None or isinstance(info["expert_action"], str),
        f"{where}: info expert_action must be text or None",
    )


def _check_step(result: object, where: str) -> tuple[str, float, bool, bool, dict]:
    _require(
        isinstance(result, tuple) and len(result) == 5,
        f"{where}: step must return (observation, reward, terminated, truncated, info)",
    )
    observation, reward, terminated, truncated, info = result
    _check_observation(observation, where)
    _require(
        isinstance(reward, float) and math.isfinite(reward), f"{where}: reward must be a finite float, got {reward!r}"
    )
    _require(
        isinstance(terminated, bool) and isinstance(truncated, bool), f"{where}: terminated and truncated must be bool"
    )
    _require(not (terminated and truncated), f"{where}: an episode is either terminated or truncated, never both")
    _check_info(info, where)
    return observation, reward, terminated, truncated, info


def _expect_env_error(call, where: str) -> None:
    try:
        call()
    except EnvError:
        return
    except Exception as error:
        raise EnvCheckError(f"{where}: expected EnvError, got {type(error).__name__}: {error}") from None
    raise EnvCheckError(f"{where}: expected EnvError, but the call succeeded")


def check_env(make_env, tasks: Sequence[Task], seed: int = 0) -> None:
    """Raise `EnvCheckError` unless the environments made by `make_env()` keep the contract.

    `make_env` is a zero-argument factory, so the check can also see a fresh environment.
    Each task is reset twice (same observation), stepped with an unknown action, then played
    with random available actions until the episode ends.
    """
    _require(bool(tasks), "check_env needs at least one task")
    fresh: Env = make_env()
    try:
        _require(isinstance(fresh, Env), f"{type(fresh).__name__} lacks reset/step/close/name/max_steps")
        _require(isinstance(fresh.max_steps, int) and fresh.max_steps >= 1, "max_steps must be a positive int")
        _expect_env_error(lambda: fresh.step("look"), "step before reset")
    finally:
        fresh.close()

    rng = random.Random(seed)
    env: Env = make_env()
    try:
        for task in tasks:
            where = f"task {task.task_id}"
            first = env.reset(task)
            _require(isinstance(first, tuple) and len(first) == 2, f"{where}: reset must return (observation, info)")
            _check_observation(first[0], f"{where} reset")
            _check_info(first[1], f"{where} reset")
            again, _ = env.reset(task)
            _require(again == first[0], f"{where}: two resets to the same task gave different observations")
            _require(bool(parse_state(again).actions), f"{where}: no available actions at reset")

            _check_step(env.step(UNKNOWN_ACTION), f"{where} unknown action")
            observation, _ = env.reset(task)
            steps, ended = 0, False
            while not ended:
                actions = parse_state(observation).actions or (UNKNOWN_ACTION,)
                observation, _, terminated, truncated, _ = _check_step(
                    env.step(rng.choice(actions)), f"{where} step {steps}"
                )
                steps += 1
                ended = terminated or truncated
                _require(steps <= env.max_steps, f"{where}: ran past max_steps={env.max_steps}")
                _require(
                    not truncated or steps == env.max_steps,
                    f"{where}: truncated at step {steps}, before max_steps={env.max_steps}",
                )
            _expect_env_error(lambda: env.step("look"), f"{where} step after the episode ended")
    finally:
        env.close()
