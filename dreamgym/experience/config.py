"""The `experience` section of `params.yaml`: the experience model (`dreamgym/experience/`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic.dataclasses import dataclass

from dreamgym.sections import STRICT, described, model_help


@dataclass(config=STRICT)
class ExperienceConfig:
    """The experience model: SFT examples, the causal LM, training, generation, fidelity."""

    # Examples (the ablations are these three set to 0 / false)
    history: Annotated[
        int, described("h: previous steps of the episode shown in the prompt.", ge=0, le=50, part="prompt")
    ] = 3
    neighbours: Annotated[
        int,
        described(
            "k: similar transitions retrieved from the buffer into the "
            "prompt (never from the same trajectory); 0 turns retrieval off.",
            ge=0,
            le=32,
            part="prompt",
        ),
    ] = 1
    domain: Annotated[
        Literal["textworld-cooking", "none"],
        described(
            "The environment's rules that retrieval ranks by (dreamgym/domain.py): 'textworld-cooking' "
            "(envs/textworld/cooking.py), or 'none' for an environment without its own yet.",
            part="prompt",
        ),
    ] = "textworld-cooking"
    ranking_off: Annotated[
        tuple[str, ...],
        described(
            "Ranking keys switched off, to measure what each adds (experience/rerank.py RANKING_KEYS: "
            "action, action_form, change_fits, task_relation, acted_items, open_closed, kind, progress, "
            "shared_items).",
            part="prompt",
        ),
    ] = ()
    retrieval_pool: Annotated[
        int,
        described(
            "Candidates fetched from the buffer per query, of which the k closest in situation (the "
            "same action, a change that fits the state, the same acted-on items, then the most state "
            "items in common) are shown (experience/rerank.py); "
            "0: the k nearest by embedding.",
            ge=0,
            le=1000,
            part="prompt",
        ),
    ] = 600
    reasoning: Annotated[
        bool, described("Train and generate a reasoning trace before the next state.", part="prompt")
    ] = True
    copy_examples: Annotated[
        bool,
        described(
            "Completions name a worked example whose change is the answer ('same as example 1') "
            "instead of writing that change out, and the parser puts the example's change in its "
            "place (experience/format.py); false: every change written out (a small model copies "
            "a shown change badly when it writes it out).",
            part="prompt",
        ),
    ] = True
    learnt_actions: Annotated[
        bool,
        described(
            "Show each worked example's change as the change it makes in the query's state: its "
            "objects keep their own states, and without its actions line, with the actions learnt "
            "from the state's objects "
            "(experience/affordances.py; learnt from the training data, saved beside the model).",
            part="prompt",
        ),
    ] = True
    remember_places: Annotated[
        bool,
        described(
            "With learnt_actions: a move back into a place the episode has been shows it as the episode "
            "last saw it, with what the player carries now (experience/places.py), instead of the "
            "model's guess; the reward and the end stay the model's.",
            part="generation",
        ),
    ] = True
    synthetic_neighbours: Annotated[
        bool,
        described(
            "Let retrieval return synthetic transitions (written back by DreamEnv) as worked "
            "examples; off: real ones only, as grounding.",
            part="retrieval",
        ),
    ] = False
    annotator: Annotated[
        Literal["state-diff", "openai"],
        described(
            "Who writes reasoning traces: 'state-diff' derives them from the state change; 'openai' "
            "asks an OpenAI-compatible endpoint (annotator_url, annotator_model).",
            part="prompt",
        ),
    ] = "state-diff"
    annotator_url: Annotated[
        str,
        described(
            "Base URL of the OpenAI-compatible server, e.g. http://localhost:8000/v1 (annotator: openai).",
            part="prompt",
        ),
    ] = ""
    annotator_model: Annotated[str, described("Model name to ask (annotator: openai).", part="prompt")] = ""
    placeholders: Annotated[
        bool,
        described(
            "Show game-specific carried objects (the ingredients) to the model as obj1, obj2, ... in "
            "each prompt and put their names back in its predictions, so that it handles foods it "
            "never saw in training (dreamgym/placeholders.py).",
            part="prompt",
        ),
    ] = True
    variations_per_task: Annotated[
        int,
        described(
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
        described(model_help("the examples"), min_length=1, part="model"),
    ] = "from_scratch"
    vocab_size: Annotated[
        int, described("from_scratch: byte-level BPE vocabulary size.", ge=300, le=65536, part="model")
    ] = 2048
    hidden_size: Annotated[int, described("from_scratch: model width.", ge=16, part="model")] = 192
    layers: Annotated[int, described("from_scratch: transformer layers.", ge=1, part="model")] = 3
    heads: Annotated[int, described("from_scratch: attention heads (must divide hidden_size).", ge=1, part="model")] = 4
    max_length: Annotated[
        int,
        described(
            "Longest prompt + completion in tokens; longer examples are left-truncated in the prompt.",
            ge=64,
            part="model",
        ),
    ] = 1024
    # Training
    epochs: Annotated[float, described("Passes over the training examples.", gt=0, part="training")] = 2.0
    batch_size: Annotated[int, described("Examples per optimiser step.", ge=1, part="training")] = 8
    learning_rate: Annotated[
        float, described("Peak learning rate (cosine schedule after warmup).", gt=0, part="training")
    ] = 2e-3
    warmup_ratio: Annotated[float, described("Fraction of steps spent warming up.", ge=0, lt=1, part="training")] = 0.05
    save_steps: Annotated[
        int,
        described("Checkpoint every this many steps (training resumes from the last one).", ge=1, part="checkpoints"),
    ] = 100
    # Generation and evaluation
    max_new_tokens: Annotated[
        int,
        described(
            "Longest completion generated (a completion that never ends runs to it and holds up its whole batch).",
            ge=8,
            part="generation",
        ),
    ] = 320
    constrained_decoding: Annotated[
        bool,
        described(
            "Constrained decoding, five rules (the local backend only): a removal names only an item the "
            "current state has, an addition or a replacement line never repeats an item, 'same "
            "as example i' names only an example whose change fits the state, the reward and "
            "done are the ones the state-diff reasoning stated, and the completion stays in the "
            "format (sections in order, one line per field, +/- entries).",
            part="generation",
        ),
    ] = True
    name_imagined: Annotated[
        bool,
        described(
            "An object the model imagines (a placeholder it writes for no name of its prompt: what an "
            "opened container or a new room holds) takes the name of an object the task asks for that "
            "the episode has not shown yet, in the task's order; off: it stays a placeholder (obj3) "
            "(dreamgym/placeholders.py).",
            part="generation",
        ),
    ] = True
    retries: Annotated[
        int,
        described(
            "Sampled retries of a completion that does not parse, before it is reported as a failure.",
            ge=0,
            part="generation",
        ),
    ] = 2
    backend: Annotated[
        Literal["local", "http"],
        described(
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
        str,
        described("Base URL of the completions server, e.g. http://gpu-box:8000/v1 (backend: http).", part="backend"),
    ] = ""
    backend_model: Annotated[
        str,
        described(
            "The served model's name (backend: http): vLLM's --served-model-name (by default the path it "
            "serves), or exactly the path given to `transformers serve`.",
            part="backend",
        ),
    ] = ""
    backend_batching: Annotated[
        Literal["auto", "list", "single"],
        described(
            "How a batch's prompts go to the server (backend: http): 'list' in one request (vLLM, the "
            "OpenAI API); 'single' one prompt per request, a few at a time (transformers serve takes no "
            "list); 'auto' sends a list and, when the server refuses lists but takes the prompt alone, "
            "goes on one prompt per request for the rest of the run.",
            part="backend",
        ),
    ] = "auto"
    backend_timeout: Annotated[
        float,
        described(
            "Seconds to wait for one request's answer: a batch's, or one prompt's (backend: http).",
            gt=0,
            part="backend",
        ),
    ] = 60.0
    backend_retries: Annotated[
        int,
        described(
            "Retries, with exponential backoff, of a request that fails to connect, times out or gets "
            "HTTP 429/5xx (backend: http).",
            ge=0,
            part="backend",
        ),
    ] = 3
    eval_games: Annotated[
        int, described("Held-out games to measure fidelity on (0: all).", ge=0, part="evaluation")
    ] = 0
    multi_step: Annotated[
        int, described("Open-loop steps replayed through the model per episode.", ge=0, part="evaluation")
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
