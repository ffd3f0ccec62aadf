"""The experience model over HTTP (experience.backend: http) against real local servers: one that
serves a real tiny experience model the way an OpenAI-compatible server (vLLM) does, and ones that
fail in the ways a remote server can (overloaded, refusing, unreachable, too slow)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from conftest import TINY_EXPERIENCE as TINY  # the tiny model that knows the first episode by heart

import dreamgym.experience.remote as remote_module
from dreamgym.config import PipelineConfig
from dreamgym.envs.dynamics import Query
from dreamgym.experience.config import ExperienceConfig
from dreamgym.experience.decoding import STOP, sample_seed
from dreamgym.experience.examples import history_of
from dreamgym.experience.generate import ExperienceBackendError, ExperienceModel, open_experience_model
from dreamgym.experience.remote import RemoteExperienceModel
from dreamgym.lm.model import load_model
from dreamgym.state import parse_state

STEPS = 4  # transitions asked: enough to compare

Answer = Callable[[dict, int], tuple[int, dict]]  # (request body, request number) -> (status, reply)


class _CompletionsHandler(BaseHTTPRequestHandler):
    """POST /v1/completions, answered by the server's `answer`; every request is recorded."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        if self.path != "/v1/completions":
            status, reply = 404, {"error": {"message": f"no route {self.path}"}}
        else:
            status, reply = self.server.answer(body, len(self.server.requests))
        payload = json.dumps(reply).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (the timeout test)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def serve(answer: Answer) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CompletionsHandler)
    server.requests, server.answer = [], answer
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def remote(server_or_port, **settings) -> RemoteExperienceModel:
    port = server_or_port if isinstance(server_or_port, int) else server_or_port.server_address[1]
    config = dataclasses.replace(
        TINY, backend="http", backend_url=f"http://127.0.0.1:{port}/v1/", backend_model="tiny", **settings
    )
    return RemoteExperienceModel(config)


def completions(*choices: dict) -> tuple[int, dict]:
    return 200, {"id": "cmpl-1", "object": "text_completion", "model": "tiny", "choices": list(choices)}


def serve_model(model, tokenizer) -> Answer:
    """Completions from a transformers model, as vLLM gives them: the prompts batched, the text cut
    before the stop string (dropped), `finish_reason` 'stop' with `stop_reason` the stop string (or
    None on EOS) or 'length'; a prompt that does not fit the context is refused with HTTP 400."""

    @torch.inference_mode()
    def answer(body: dict, _: int) -> tuple[int, dict]:
        prompts, stop, max_tokens = body["prompt"], body["stop"], body["max_tokens"]
        inputs = tokenizer(prompts, return_tensors="pt", padding=True)
        context = model.config.max_position_embeddings
        for ids in tokenizer(prompts)["input_ids"]:
            if len(ids) + max_tokens > context:
                return 400, {"error": {"message": f"maximum context length is {context} tokens"}}
        sample = body["temperature"] > 0
        if sample:
            torch.manual_seed(body["seed"])
        output = model.generate(
            **inputs,
            max_new_tokens=max_tokens,
            do_sample=sample,
            temperature=body["temperature"] if sample else None,
            top_p=None,
            top_k=None,
            use_cache=True,
            stop_strings=stop,
            tokenizer=tokenizer,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        choices = []
        for index, row in enumerate(output[:, inputs["input_ids"].shape[1] :].tolist()):
            text = tokenizer.decode(row, skip_special_tokens=True)
            hit = next((s for s in stop if s in text), None)
            if hit is not None:
                choice = {"text": text[: text.index(hit)], "finish_reason": "stop", "stop_reason": hit}
            elif tokenizer.eos_token_id in row:
                choice = {"text": text, "finish_reason": "stop", "stop_reason": None}
            else:
                choice = {"text": text, "finish_reason": "length", "stop_reason": None}
            choices.append({"index": index, **choice})
        return completions(*reversed(choices))  # `index` orders them, not the list

    return answer


@pytest.fixture(scope="module")
def episode_rows(first_episode) -> list[dict]:
    return first_episode[:STEPS]


@pytest.fixture(scope="module")
def model_dir(tiny_experience):
    return tiny_experience.model_dir


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote_module, "BACKOFF_SECONDS", 0.01)


def test_predictions_over_http_are_the_local_ones(model_dir, episode_rows):
    queries = [
        Query(
            row["instruction"],
            parse_state(row["state"]),
            row["action"],
            tuple(history_of(episode_rows, index, TINY.history)),
            row["trajectory_id"],
        )
        for index, row in enumerate(episode_rows)
    ]
    # The server decodes freely (no constrained decoding there): so does the local model compared.
    local_model = ExperienceModel(*load_model(model_dir), dataclasses.replace(TINY, constrained_decoding=False))
    local = local_model.predict(queries)
    with serve(serve_model(*load_model(model_dir))) as server:
        over_http = remote(server).predict(queries)
    assert any(p.ok for p in local), [p.error for p in local]  # the comparison sees real states
    assert [(p.completion, p.text, p.attempts, p.error) for p in over_http] == [
        (p.completion, p.text, p.attempts, p.error) for p in local
    ]
    first = server.requests[0]
    assert first["model"] == "tiny" and first["prompt"] == local_model.prompts(queries)
    assert first["max_tokens"] == TINY.max_new_tokens and first["stop"] == [STOP]
    assert first["temperature"] == 0 and "seed" not in first
    for retry in server.requests[1:]:  # a completion that did not parse is sampled again, seeded
        assert retry["temperature"] > 0 and len(retry["prompt"]) == 1
        assert retry["seed"] == sample_seed(0, 1, retry["prompt"])


def test_choices_come_back_in_prompt_order_with_the_stop_string(fast_backoff):
    def answer(body: dict, number: int) -> tuple[int, dict]:
        if number <= 2:  # overloaded twice, then it answers
            return 503, {"error": {"message": "busy"}}
        return completions(
            {"index": 2, "text": "cut short", "finish_reason": "length"},
            {"index": 0, "text": "<done>false", "finish_reason": "stop"},  # plain OpenAI
            {"index": 1, "text": "ended by EOS", "finish_reason": "stop", "stop_reason": None},  # vLLM
            {"index": 3, "text": f"<done>true{STOP}", "finish_reason": "stop", "stop_reason": STOP},
        )

    with serve(answer) as server:
        texts = remote(server).generate(["a", "b", "c", "d"])
    assert texts == [f"<done>false{STOP}", "ended by EOS", "cut short", f"<done>true{STOP}"]
    assert len(server.requests) == 3 and server.requests[-1]["prompt"] == ["a", "b", "c", "d"]


def test_a_refusal_is_not_retried_and_says_where_and_why(fast_backoff):
    def answer(body: dict, _: int) -> tuple[int, dict]:
        return 400, {"error": {"message": f"The model `{body['model']}` does not exist."}}

    with serve(answer) as server:
        model = remote(server)
        with pytest.raises(ExperienceBackendError) as caught:
            model.generate(["a"])
    message = str(caught.value)
    assert model.url in message and "HTTP 400" in message and "does not exist" in message
    assert "experience.backend_model" in message and len(server.requests) == 1


def test_answers_that_are_not_completions_are_refused(fast_backoff):
    replies = iter([(200, {"object": "error"}), completions({"index": 0, "text": "only one"})])
    with serve(lambda body, _: next(replies)) as server:
        model = remote(server)
        with pytest.raises(ExperienceBackendError, match="not a completions answer"):
            model.generate(["a", "b"])
        with pytest.raises(ExperienceBackendError, match="1 choices for 2 prompts"):
            model.generate(["a", "b"])


def test_an_unreachable_server_fails_quickly_and_clearly():
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _CompletionsHandler)
    port = closed.server_address[1]
    closed.server_close()
    started = time.monotonic()
    with pytest.raises(
        ExperienceBackendError, match=rf"127\.0\.0\.1:{port}/v1/completions: request failed .*backend_url"
    ):
        remote(port, backend_retries=0).generate(["a"])
    assert time.monotonic() - started < 5


def test_a_slow_server_times_out_after_its_retries(fast_backoff):
    def answer(body: dict, _: int) -> tuple[int, dict]:
        time.sleep(1.5)
        return completions({"index": 0, "text": "too late", "finish_reason": "length"})

    with serve(answer) as server:
        with pytest.raises(ExperienceBackendError, match=r"no answer within 0\.3s.*backend_timeout.*2 attempts"):
            remote(server, backend_timeout=0.3, backend_retries=1).generate(["a"])
        assert len(server.requests) == 2


def test_the_http_backend_is_configured_explicitly(tmp_path):
    with pytest.raises(ValueError, match="backend_url"):
        ExperienceConfig(backend="http")
    with pytest.raises(ValueError, match="backend_model"):
        ExperienceConfig(backend="http", backend_url="http://gpu-box:8000/v1")
    settings = dataclasses.replace(TINY, backend="http", backend_url="http://gpu-box:8000/v1", backend_model="tiny")
    # No weights here: the served model is used, and no buffer is opened without retrieval.
    with open_experience_model(tmp_path / "not-here", tmp_path, PipelineConfig(experience=settings)) as model:
        assert isinstance(model, RemoteExperienceModel) and model.model is None
        assert model.url == "http://gpu-box:8000/v1/completions" and model.config == settings


def takes_no_list(body: dict, _: int) -> tuple[int, dict]:
    """Answers as transformers serve does: a list of prompts refused (HTTP 400), a prompt alone
    completed with the stop string kept, and whatever the token that completed it held after it.
    The first prompt's answer comes last, so that order is the prompts', not the answers'."""
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        return 400, {"detail": "prompt must be a string."}
    if prompt == "a":
        time.sleep(0.2)
    return completions({"index": 0, "text": f"<done>{prompt}{STOP}\n", "finish_reason": "stop"})


def test_a_server_that_takes_no_list_gets_one_prompt_per_request():
    with serve(takes_no_list) as server:
        model = remote(server)  # experience.backend_batching: auto
        assert model.generate(["a", "b", "c"]) == [f"<done>{p}{STOP}" for p in "abc"]
        # The batch refused, a one-token probe refused as a list and taken alone, then each prompt.
        first, probe_list, probe_alone, *alone = server.requests
        assert first["prompt"] == ["a", "b", "c"] and probe_list["prompt"] == ["a"] and probe_alone["prompt"] == "a"
        assert probe_list["max_tokens"] == probe_alone["max_tokens"] == 1
        assert sorted(body["prompt"] for body in alone) == ["a", "b", "c"]
        assert all(body["max_tokens"] == TINY.max_new_tokens for body in alone)
        # Learnt once, for the model's life: the next batch goes one prompt per request at once.
        del server.requests[:]
        assert model.generate(["d", "e"]) == [f"<done>d{STOP}", f"<done>e{STOP}"]
        assert sorted(body["prompt"] for body in server.requests) == ["d", "e"]
        assert model.takes_lists is False


def test_a_sampled_prompt_alone_is_seeded_by_itself_and_asks_transformers_to_sample():
    with serve(takes_no_list) as server:
        remote(server, backend_batching="single").generate(["b", "c"], sample=True, attempt=2)
    assert [body["prompt"] for body in server.requests] == ["b", "c"]  # one after the other
    for body in server.requests:
        assert body["seed"] == sample_seed(0, 2, [body["prompt"]]) and body["temperature"] > 0
        assert json.loads(body["generation_config"]) == {"do_sample": True, "top_k": 0, "top_p": 1.0}


def test_list_batching_set_by_hand_says_what_to_set_when_lists_are_refused():
    refused = pytest.raises(ExperienceBackendError, match=r"prompt must be a string.*backend_batching: single or auto")
    with serve(takes_no_list) as server, refused:
        remote(server, backend_batching="list").generate(["a", "b"])
    assert len(server.requests) == 1  # no probe: the setting says lists


def test_a_refused_prompt_is_not_taken_for_a_refused_list():
    def answer(body: dict, _: int) -> tuple[int, dict]:  # vLLM: lists taken, a long prompt refused
        prompts = body["prompt"]
        if "long" in prompts:
            return 400, {"error": {"message": "The decoder prompt (length 900) is longer than the maximum 768."}}
        return completions(*({"index": i, "text": "x", "finish_reason": "length"} for i in range(len(prompts))))

    with serve(answer) as server:
        model = remote(server)
        with pytest.raises(ExperienceBackendError, match=r"decoder prompt .* is longer"):
            model.generate(["short", "long"])
        assert [body["prompt"] for body in server.requests] == [["short", "long"], ["short"]]
        assert model.takes_lists is True  # the probe's list of one was taken
        assert model.generate(["short", "other"]) == ["x", "x"]
        assert server.requests[-1]["prompt"] == ["short", "other"]


def test_each_prompt_alone_is_retried_on_its_own(fast_backoff):
    refused_once = set()

    def answer(body: dict, _: int) -> tuple[int, dict]:
        if body["prompt"] == "b" and "b" not in refused_once:
            refused_once.add("b")
            return 503, {"error": {"message": "busy"}}
        return takes_no_list(body, 0)

    with serve(answer) as server:
        texts = remote(server, backend_batching="single").generate(["a", "b", "c"])
    assert texts == [f"<done>{p}{STOP}" for p in "abc"]
    assert sorted(body["prompt"] for body in server.requests) == ["a", "b", "b", "c"]
