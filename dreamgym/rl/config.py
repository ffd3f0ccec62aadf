"""The `rl` and `curriculum` sections of `params.yaml`: reinforcement learning of the policy
(`dreamgym/rl/`) and the task curriculum of synthetic RL (`dreamgym/curriculum.py`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic.dataclasses import dataclass

from dreamgym.sections import STRICT, described


@dataclass(config=STRICT)
class RLConfig:
    """Reinforcement learning of the policy (`dreamgym/rl/`), in DreamEnv or the real game."""

    algorithm: Annotated[
        Literal["grpo", "ppo"],
        described(
            "'grpo': groups of rollouts per task, group-normalised episode advantages; 'ppo': value head and GAE."
        ),
    ] = "grpo"
    env: Annotated[
        Literal["dream", "real"],
        described(
            "Where the policy learns: 'dream' in DreamEnv (the experience model, no real transitions) "
            "with the curriculum; 'real' in the TextWorld training games, up to real_budget transitions."
        ),
    ] = "dream"
    reward: Annotated[
        Literal["outcome", "score", "progress"],
        described(
            "'outcome': 1 at the end of a won episode, else 0 (the paper's choice); 'score': the "
            "game's score increases (the env's step rewards): on the headroom games the outcome left most "
            "groups of rollouts alike, and RL unchanged (results log, 2026-12-02); 'progress': the "
            "score's increases, taken back when the game is lost (a rushed, lost episode returns 0)."
        ),
    ] = "score"
    epochs: Annotated[int, described("RL epochs; each draws curriculum.tasks_per_epoch tasks.", ge=0)] = 6
    group_size: Annotated[int, described("Rollouts per task and epoch (GRPO's G; PPO plays as many).", ge=1)] = 4
    deny_lost_moves: Annotated[
        bool,
        described(
            "Play a task's rollouts one after another, each denied the moves by which the earlier ones "
            "lost from the same state (dreamgym/rl/rollout.py): a policy sure of a losing move repeats "
            "it in every rollout, and its group teaches GRPO nothing. false: the rollouts play side by side."
        ),
    ] = False
    max_steps: Annotated[
        int,
        described(
            "Steps before an RL episode is truncated; shorter than evaluation.max_steps, RL cannot win the "
            "games whose shortest path is longer (a headroom game's expert path takes up to 32 steps).",
            ge=1,
            le=1000,
        ),
    ] = 50
    learning_rate: Annotated[
        float,
        described(
            "Adam learning rate of the RL updates (BC's own rate, 1e-3, undoes the cloned policy in one update).", gt=0
        ),
    ] = 1e-4
    update_epochs: Annotated[int, described("Passes over each epoch's rollouts.", ge=1)] = 2
    minibatch_size: Annotated[int, described("Decisions per gradient step.", ge=1)] = 64
    clip: Annotated[float, described("ε of the clipped probability ratio (and of PPO's value clip).", gt=0, lt=1)] = 0.2
    # 0.05 let the dream's 10K synthetic transitions draw the policy away from BC, to a game the
    # experience model imagines: -6 and -10 held-out headroom games of 100; at 0.5, -1 and +2
    # (results log, 2026-12-06, evening).
    kl_coef: Annotated[float, described("β: weight of KL(policy || reference BC policy).", ge=0)] = 0.5
    entropy_coef: Annotated[float, described("Weight of the entropy bonus.", ge=0)] = 0.01
    gamma: Annotated[float, described("Discount γ of PPO's GAE.", ge=0, le=1)] = 0.99
    lam: Annotated[float, described("PPO GAE λ.", ge=0, le=1)] = 0.95
    value_coef: Annotated[float, described("PPO value-loss weight.", ge=0)] = 0.5
    max_grad_norm: Annotated[float, described("Gradient norm clip.", gt=0)] = 1.0
    temperature: Annotated[
        float,
        described(
            "Softmax temperature of the action choice during rollouts (and in the losses). Behaviour "
            "cloning trains the softmax at 1 (dreamgym/policy/bc.py), so 1 samples the policy it "
            "learned; below 1 sharpens it (fewer different outcomes per GRPO group).",
            gt=0,
        ),
    ] = 1.0
    real_budget: Annotated[
        int, described("env real: the run stops after this many real transitions (counted, logged).", ge=1)
    ] = 3000
    synthetic_budget: Annotated[
        int,
        described(
            "env dream: no epoch starts once the run has taken this many synthetic transitions (predicted and "
            "recalled; the last epoch may pass it). 0: epochs alone end the run.",
            ge=0,
        ),
    ] = 0
    s2r_budget: Annotated[
        int,
        described(
            "Sim-to-real: after RL in DreamEnv, RL in the real training games for this many real transitions (0: off).",
            ge=0,
        ),
    ] = 0
    real_check_every: Annotated[
        int,
        described(
            "env dream: play the tasks of every k-th epoch (from the first) in their real games too, for the "
            "dream-vs-real gap (dreamgym/rl/monitor.py; measured, never learnt from); 0: never. Where the "
            "real game is slow, a check every epoch costs a dream run much of its time.",
            ge=0,
        ),
    ] = 1
    write_back: Annotated[bool, described("Write DreamEnv's synthetic transitions into the buffer.")] = True
    recall_real: Annotated[
        bool,
        described(
            "In DreamEnv, a step that the offline real data recorded (same task, instruction, state and action, "
            "always with one outcome) gets that recorded outcome; the experience model predicts the rest "
            "(dreamgym/envs/recall.py). false: the model predicts every step."
        ),
    ] = True


@dataclass(config=STRICT)
class CurriculumConfig:
    """The reward-entropy task curriculum of synthetic RL (`dreamgym/curriculum.py`)."""

    enabled: Annotated[
        bool,
        described(
            "Pick tasks by reward uncertainty and write variations of the "
            "top ones; false (the ablation): seed tasks sampled uniformly, "
            "no variations."
        ),
    ] = True
    selection: Annotated[
        Literal["entropy", "variance"],
        described(
            "Task score: 'variance' of its episode returns (those rl.reward gives GRPO) or 'entropy' of the "
            "task's success rate (bits), over its recent rollouts. With score rewards, entropy scores every "
            "task the policy never wins 0."
        ),
    ] = "variance"
    window: Annotated[int, described("Recent rollouts per task that count towards its score.", ge=1)] = 32
    tasks_per_epoch: Annotated[int, described("Tasks drawn for each RL epoch.", ge=1)] = 8
    variation_fraction: Annotated[
        float,
        described(
            "λ: share of each epoch's tasks that are new variations (rejected ones are replaced by "
            "pool tasks); 0 writes none.",
            ge=0.0,
            le=1.0,
        ),
    ] = 0.25
    top_fraction: Annotated[
        float,
        described(
            "Variations are written from this top-scoring share of the seed tasks (at least one).", gt=0.0, le=1.0
        ),
    ] = 0.5
    variations: Annotated[
        Literal["games", "model", "domain"],
        described(
            "Who writes the variations: 'games', the environment, as a real game one step harder "
            "than the seed (TextWorld: a larger recipe, more to find, more rooms) or one the project "
            "has not used (ScienceWorld: another train variation of the seed's task type), its start "
            "read by a reset; "
            "'model', the experience model's backbone (the paper; experience.variations_per_task "
            "trains it to); 'domain', the environment's rules (experience.domain): the seed's start "
            "under another task it could pose."
        ),
    ] = "games"
