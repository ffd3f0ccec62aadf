"""The experience model on an OpenAI-compatible completions server (experience.backend: http).

`RemoteExperienceModel` (experience.backend: http) generates on an OpenAI-compatible completions
server instead (infra/SERVING.md): `vllm serve <model_dir>` on a GPU box takes a batch's prompts as
one list in one request; `transformers serve <model_dir>` (CPU) takes one prompt per request, so
each prompt goes alone, a few requests at a time (experience.backend_batching; 'auto' finds out at
the first batch). Retrieval, prompts, parsing and retries are the same code as for the local model.

Decoding over HTTP, against the local backend:
- kept: the first attempt is greedy (temperature 0); a retry samples at RETRY_TEMPERATURE with no
  top-k or top-p cut, seeded by `sample_seed` (`seed` in the request: vLLM seeds the request
  itself; transformers serve reseeds its process-wide generator, so sampled requests go one at a
  time), and also carries transformers serve's own `generation_config` field, without which it
  decodes greedily whatever the temperature (vLLM ignores the field); at most max_new_tokens; the
  stop string, each completion cut right after it (and given it back where the server drops it).
- lost: constrained decoding (experience.constrained_decoding; the server knows nothing of states
  or worked examples, so a completion the rules would have steered may fail to parse and be
  retried); the left-truncation of a prompt longer than max_length - max_new_tokens (vLLM refuses
  it with HTTP 400; transformers serve decodes it past the model's trained context); compaction
  (the server schedules the batch). With constrained decoding off locally, greedy predictions over
  HTTP are the local ones (tests/test_experience_serve.py, against transformers serve), up to the
  float rounding of other kernels and batch shapes, which can flip a near-tie.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from dreamgym.experience.affordances import Affordances
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.decoding import RETRY_TEMPERATURE, STOP, ended_at_stop, sample_seed
from dreamgym.experience.generate import ExperienceBackendError, ExperienceModel
from dreamgym.state import AbstractState

BACKOFF_SECONDS = 0.5  # backend http: the first retry waits this long, each next one twice as long
_RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
_REFUSED_STATUS = frozenset({400, 422})  # a refusal that names the prompt: see PromptRefusedError
# One-prompt requests (a server that takes no list) in flight at once: enough to keep a batching
# server (vLLM, transformers serve --continuous-batching) busy; a sequential one (plain transformers
# serve) queues them, so more would only wait longer against experience.backend_timeout.
SINGLE_REQUESTS = 8
# transformers serve samples only when the request's `generation_config` says so (a saved model's
# generation_config.json sets no do_sample: greedy, whatever the temperature), and then with
# transformers' default top-k 50 unless told otherwise; the local retry has no top-k or top-p cut.
# vLLM ignores the field.
SAMPLING_CONFIG = json.dumps({"do_sample": True, "top_k": 0, "top_p": 1.0})


class PromptRefusedError(ExperienceBackendError):
    """A server's refusal (HTTP 400/422) that names the prompt: the prompts themselves (e.g. one too
    long for the context), or a list of them where the server takes one prompt per request."""


class RemoteExperienceModel(ExperienceModel):
    """The experience model served by an OpenAI-compatible completions endpoint (e.g. vLLM serving
    the trained model directory); no local weights. A batch is one request with the list of its
    prompts, or one request per prompt where the server takes no list (experience.backend_batching);
    each request is retried on its own (connection errors, timeouts, HTTP 429/5xx).

    The server tokenizes and does not truncate: a prompt longer than its context is refused
    (HTTP 400) by vLLM, where the local model would left-truncate it to
    `max_length - max_new_tokens`. The module docstring says which decoding rules hold over HTTP.
    """

    def __init__(
        self,
        config: ExperienceConfig,
        database=None,
        encoder=None,
        ef_search: int = 80,
        seed: int = 0,
        kept_names: frozenset[str] | None = None,
        affordances: Affordances | None = None,
    ):
        if not (config.backend_url and config.backend_model):
            raise ValueError("a remote experience model needs experience.backend_url and experience.backend_model")
        super().__init__(None, None, config, database, encoder, ef_search, seed, kept_names, affordances)
        self.url = f"{config.backend_url.rstrip('/')}/completions"
        # Whether the server takes a list of prompts: set, or (auto: None) learnt from the first
        # batch and kept for the model's life, so that no later batch pays for a refused request.
        self.takes_lists: bool | None = {"list": True, "single": False}.get(config.backend_batching)

    def generate(
        self,
        prompts: Sequence[str],
        sample: bool = False,
        attempt: int = 0,
        states: Sequence[AbstractState] | None = None,
        changes: Sequence[Sequence[str]] | None = None,
        traces: Sequence[Sequence[str | None]] | None = None,
    ) -> list[str]:
        """Completions of `prompts`: greedy, or sampled (seeded) for a retry. Nothing is constrained
        here (`states`, `changes` and `traces` are unused): the server decodes freely."""
        if not prompts:
            return []
        if sample and len(prompts) > 1:  # each retry seeded by its own prompt: one request each
            return [self.generate([prompt], sample, attempt)[0] for prompt in prompts]
        if self.takes_lists is not False:
            try:
                texts = self._texts(self._post(self._body(list(prompts), sample, attempt)), len(prompts))
            except PromptRefusedError as refusal:
                if self.takes_lists is None:  # auto: is it the list that is refused, or the prompts?
                    self.takes_lists = not self._refuses_lists(prompts[0])
                    if not self.takes_lists:
                        return self._one_by_one(prompts, sample, attempt)
                if self.config.backend_batching == "list":
                    raise ExperienceBackendError(
                        f"{refusal}; if the server takes one prompt per request (transformers serve), "
                        "set experience.backend_batching: single or auto"
                    ) from None
                raise refusal
            self.takes_lists = True
            return texts
        return self._one_by_one(prompts, sample, attempt)

    def _body(self, prompt: str | list[str], sample: bool, attempt: int) -> dict:
        """The request for `prompt` (a batch's list, or one prompt)."""
        body = {
            "model": self.config.backend_model,
            "prompt": prompt,
            "max_tokens": self.config.max_new_tokens,
            "temperature": RETRY_TEMPERATURE if sample else 0,
            "stop": [STOP],
        }
        if sample:
            body["seed"] = sample_seed(self.seed, attempt, [prompt] if isinstance(prompt, str) else prompt)
            body["generation_config"] = SAMPLING_CONFIG
        return body

    def _refuses_lists(self, prompt: str) -> bool:
        """Whether the server refuses a list of prompts but takes the prompt alone; asked with
        one-token completions of `prompt`, as a list of one and then alone. A refusal of the
        prompt alone is raised: the prompts themselves are what the server refuses."""
        probe = {"model": self.config.backend_model, "max_tokens": 1, "temperature": 0}
        try:
            self._post(probe | {"prompt": [prompt]})
        except PromptRefusedError:
            self._post(probe | {"prompt": prompt})
            return True
        return False  # a list is taken: the batch's refusal was about its prompts

    def _one_by_one(self, prompts: Sequence[str], sample: bool, attempt: int) -> list[str]:
        """Completions of `prompts`, one request each, in prompt order; at most SINGLE_REQUESTS at
        a time, and a sampled one only after the one before has its answer (transformers serve
        seeds its process-wide generator per request: two at a time would draw from each other's)."""
        bodies = [self._body(prompt, sample, attempt) for prompt in prompts]
        workers = 1 if sample else min(SINGLE_REQUESTS, len(bodies))
        if workers == 1:
            return [self._texts(self._post(body), 1)[0] for body in bodies]
        # `map` answers in prompt order and, at the first error, cancels the requests not sent yet.
        with ThreadPoolExecutor(workers, thread_name_prefix="experience-backend") as pool:
            return [self._texts(response, 1)[0] for response in pool.map(self._post, bodies)]

    def _post(self, body: dict) -> httpx.Response:
        """The server's 200 answer, after retries with backoff of what may pass (connection
        errors, timeouts, HTTP 429/5xx); `ExperienceBackendError` when there is none, and
        `PromptRefusedError` when the server refused the request naming its prompt."""
        retries = self.config.backend_retries
        for retry in range(retries + 1):
            if retry:
                time.sleep(BACKOFF_SECONDS * 2 ** (retry - 1))
            try:
                response = httpx.post(self.url, json=body, timeout=self.config.backend_timeout)
            except httpx.TimeoutException:
                problem = (
                    f"no answer within {self.config.backend_timeout:g}s; raise "
                    "experience.backend_timeout or check the server's load"
                )
                continue
            except httpx.HTTPError as error:
                problem = f"request failed ({error}); check experience.backend_url and that the server is up"
                continue
            if response.status_code == 200:
                return response
            problem = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code not in _RETRIED_STATUS:
                refused = response.status_code in _REFUSED_STATUS and "prompt" in response.text.lower()
                raise (PromptRefusedError if refused else ExperienceBackendError)(
                    f"experience backend {self.url}: {problem} (check experience.backend_model "
                    f"{self.config.backend_model!r} and experience.backend_url)"
                )
        tries = f"{retries + 1} attempt{'s' if retries else ''}"
        raise ExperienceBackendError(f"experience backend {self.url}: {problem} ({tries}; experience.backend_retries)")

    def _texts(self, response: httpx.Response, count: int) -> list[str]:
        """The completion texts in prompt order, each ending right after the stop string when the
        server stopped on it: vLLM and OpenAI drop the string (the parser wants the closing tag, so
        it is given back); transformers serve keeps it, with whatever the token that completed it
        held after it (cut, as the local model cuts it)."""
        try:
            choices = sorted(response.json()["choices"], key=lambda choice: choice["index"])
            texts = [
                (
                    choice["text"],
                    choice.get("finish_reason"),
                    # vLLM says which stop ended it (None: EOS); other servers only "stop"
                    choice.get("stop_reason", STOP),
                )
                for choice in choices
            ]
            if not all(isinstance(text, str) for text, _, _ in texts):
                raise TypeError("a choice's text is not a string")
        except (ValueError, KeyError, TypeError):
            raise ExperienceBackendError(
                f"experience backend {self.url}: not a completions answer: {response.text[:200]}"
            ) from None
        if [choice["index"] for choice in choices] != list(range(count)):
            raise ExperienceBackendError(
                f"experience backend {self.url}: {len(choices)} choices for {count} prompts "
                f"(indices {[choice['index'] for choice in choices][:10]}); the server must answer "
                "one completion per prompt (no `n` or `best_of` override)"
            )
        return [ended_at_stop(text, finish == "stop" and reason == STOP) for text, finish, reason in texts]
