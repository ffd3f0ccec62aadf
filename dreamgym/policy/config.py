"""The `policy` section of `params.yaml`: the agent's LM (`dreamgym/policy/`) and behaviour cloning."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic.dataclasses import dataclass

from dreamgym.sections import STRICT, described, model_help


@dataclass(config=STRICT)
class PolicyConfig:
    """The agent's causal LM (`dreamgym/policy/`) and its behaviour-cloning warm start."""

    history: Annotated[
        int, described("Previous actions of the episode shown in the prompt.", ge=0, le=50, part="prompt")
    ] = 2
    mode: Annotated[
        Literal["choice", "generate"],
        described(
            "'choice': score every available action by its log-likelihood and sample from the softmax "
            "over them (exact log-probs, valid actions by construction); 'generate': free text, for "
            "large instruction models (an unavailable action changes nothing, as in the game).",
            part="prompt",
        ),
    ] = "choice"
    max_new_tokens: Annotated[int, described("mode generate: longest action generated.", ge=1, part="generation")] = 16
    action_score: Annotated[
        Literal["mean", "sum"],
        described(
            "mode choice: an action's score is the 'mean' or the 'sum' of its tokens' log-likelihoods. "
            "'sum' makes an untrained model pick the shortest action almost surely (every token costs "
            "~log(vocabulary) nats), so RL never sees a success to learn from; 'mean' starts it near "
            "uniform over the available actions.",
            part="prompt",
        ),
    ] = "mean"
    placeholders: Annotated[
        bool,
        described(
            "Show game-specific objects as obj1, obj2 (named by the task, in its order) and other1, "
            "other2 (the rest), so that what the policy learns about one food carries to foods it "
            "never saw (dreamgym/policy/view.py).",
            part="prompt",
        ),
    ] = True
    avoid_repeats: Annotated[
        bool,
        described(
            "Leave out of the candidates an action the episode already took from the very same state "
            "(the games are deterministic: it leads where it led before, and a greedy policy would loop); "
            "in training and acting alike (dreamgym/policy/view.py).",
            part="prompt",
        ),
    ] = True
    task_last: Annotated[
        bool,
        described(
            "Give the task at the end of the prompt, next to the actions read against it (a small "
            "policy finds the recipe's clause for an object at a fixed distance back, whatever the state "
            "lists); false: the task first, the layout of policies saved before 2026-12-05 "
            "(dreamgym/policy/view.py).",
            part="prompt",
        ),
    ] = True
    domain: Annotated[
        Literal["textworld-cooking", "none"],
        described(
            "The environment's rules the policy uses (dreamgym/domain.py): which objects a task asks "
            "for, named obj1, obj2 in its order from the first step (dreamgym/policy/view.py), and BC's "
            "counterfactual tasks: a step that carries out a clause of its task is also shown with that "
            "clause changed, labelled with the action the changed task asks for, so that the policy must "
            "read its task instead of recalling its training games (dreamgym/policy/bc.py); 'none': "
            "objects numbered as the state shows them, the steps as they are (benchmarks/results/, "
            "2026-11-26 and 2026-11-27).",
            part="prompt",
        ),
    ] = "textworld-cooking"
    # Model (the same fields as the experience model's, for the same trainer)
    model: Annotated[
        str,
        described(model_help("the BC examples"), min_length=1, part="model"),
    ] = "from_scratch"
    vocab_size: Annotated[
        int, described("from_scratch: byte-level BPE vocabulary size.", ge=300, le=65536, part="model")
    ] = 1024
    hidden_size: Annotated[int, described("from_scratch: model width.", ge=16, part="model")] = 128
    layers: Annotated[int, described("from_scratch: transformer layers.", ge=1, part="model")] = 2
    heads: Annotated[int, described("from_scratch: attention heads (must divide hidden_size).", ge=1, part="model")] = 4
    max_length: Annotated[
        int,
        described(
            "Longest prompt + action in tokens; longer prompts lose their "
            "start (the task instruction and state come last).",
            ge=64,
            part="model",
        ),
    ] = 768
    # Behaviour cloning (dreamgym/policy/bc.py)
    epochs: Annotated[
        float,
        described("BC passes over the examples (each distinct one once, with merge_repeats).", gt=0, part="training"),
    ] = 12.0
    batch_size: Annotated[int, described("BC examples per optimiser step.", ge=1, part="training")] = 16
    merge_repeats: Annotated[
        bool,
        described(
            "mode choice: BC trains on each distinct example (the same prompt, candidates and label) once "
            "an epoch, its loss weighted by how often it occurs: the same objective in fewer steps. The "
            "noisy expert's episodes of a game share their first steps, so about a quarter of the "
            "examples repeat another (dreamgym/policy/bc.py): 26% fewer steps on the default data, "
            "+16 of 600 headroom games and -4 of 180 of the training settings at three seeds, one game "
            "past the rule set before it ran, so not the default (results log, 2026-12-07 (23:00)).",
            part="training",
        ),
    ] = False
    # At 1e-3 two runs that differ in the eighth digit at step 100 end far apart, in loss and in
    # games won; at 5e-4 they end alike (measured: results log, 2026-11-29).
    learning_rate: Annotated[float, described("BC peak learning rate.", gt=0, part="training")] = 5e-4
    warmup_ratio: Annotated[float, described("BC warmup fraction of the steps.", ge=0, lt=1, part="training")] = 0.05
    save_steps: Annotated[int, described("BC checkpoint interval in steps.", ge=1, part="checkpoints")] = 200

    def __post_init__(self) -> None:
        if self.hidden_size % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden_size ({self.hidden_size})")
