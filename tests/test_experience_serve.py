"""The experience model over HTTP (experience.backend: http) against a real OpenAI-compatible
server: `transformers serve` (transformers' `serving` extra) serving the tiny trained model folder,
on the device and in the precision the local model runs on. transformers serve takes one prompt per
request, so this also covers the fallback from a batch's list of prompts (`backend_batching: auto`).
tests/test_experience_backend.py has the imitation of vLLM and the failure modes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TINY_EXPERIENCE as TINY  # the tiny model that knows the first episode by heart
from conftest import free_ports

from dreamgym.config import PipelineConfig
from dreamgym.experience.examples import queries_of
from dreamgym.experience.generate import ExperienceBackendError, open_experience_model
from dreamgym.experience.remote import RemoteExperienceModel
from dreamgym.lm.model import device_and_dtype

STEPS = 4  # transitions asked: the first one fails to parse, so a sampled retry goes over HTTP too
START_TIMEOUT = 120  # seconds; the tiny model loads in ~6 s on 2 CPU cores


@pytest.fixture(scope="module")
def served(tiny_experience, tmp_path_factory) -> Iterator[str]:
    """The base URL (…/v1) of `transformers serve` serving the tiny model, up and healthy; the
    server is stopped when the module's tests are done, passed or not."""
    device, dtype = device_and_dtype()
    [port] = free_ports()
    log = tmp_path_factory.mktemp("transformers-serve") / "serve.log"
    command = [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        str(tiny_experience.model_dir),  # preloaded; requests must name it exactly so
        "--host=127.0.0.1",
        f"--port={port}",
        f"--device={device.type}",
        f"--dtype={str(dtype).removeprefix('torch.')}",
    ]
    with log.open("w") as output:
        server = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=os.environ | {"HF_HUB_OFFLINE": "1"}
        )
    try:
        _wait_until_healthy(server, port, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_until_healthy(server: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"transformers serve exited with code {server.returncode}:\n{_tail(log)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.25)
    pytest.fail(f"transformers serve did not answer /health within {START_TIMEOUT}s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def rows(first_episode) -> list[dict]:
    return first_episode[:STEPS]


def _settings(backend_url: str = "", backend_model: str = "", **experience_settings) -> PipelineConfig:
    # The server decodes freely (no constrained decoding there): so does the local model compared.
    experience = dataclasses.replace(TINY, constrained_decoding=False, **experience_settings)
    if backend_url:
        experience = dataclasses.replace(
            experience, backend="http", backend_url=backend_url, backend_model=backend_model
        )
    return PipelineConfig(experience=experience)


def test_predictions_from_transformers_serve_are_the_local_ones(tiny_experience, served, rows, tmp_path):
    model_dir = tiny_experience.model_dir
    queries = queries_of(rows, TINY.history)
    # Both built as the pipeline builds them, the served one reading its prompt shape from model_dir.
    with open_experience_model(model_dir, tmp_path, _settings()) as local:
        expected = local.predict(queries)
    with open_experience_model(model_dir, tmp_path, _settings(served, str(model_dir))) as remote:
        assert isinstance(remote, RemoteExperienceModel)
        over_http = remote.predict(queries)
        assert remote.takes_lists is False  # it found out that the server takes one prompt per request
    assert any(p.ok for p in expected), [p.error for p in expected]  # the comparison sees real states
    assert any(p.attempts > 1 for p in expected)  # and a sampled retry
    assert [(p.completion, p.text, p.attempts, p.error) for p in over_http] == [
        (p.completion, p.text, p.attempts, p.error) for p in expected
    ]


def test_sampled_retries_over_http_are_seeded_like_the_local_ones(tiny_experience, served, rows, tmp_path):
    # A prompt the model never saw the like of: a spread-out next-token distribution, so that
    # different seeds draw different completions (within a few tokens: short ones are enough).
    # Two seeds can still draw the same completion from a trained model (CI saw it once), so five
    # are drawn: the test needs only that some differ.
    short = {"max_new_tokens": 24}
    attempts = (1, 2, 3, 4, 5)
    with open_experience_model(tiny_experience.model_dir, tmp_path, _settings(**short)) as local:
        prompt = local.prompts(queries_of(rows, TINY.history))[0] + " fridge carrot"
        expected = [local.generate([prompt], sample=True, attempt=attempt)[0] for attempt in attempts]
    remote = RemoteExperienceModel(_settings(served, str(tiny_experience.model_dir), **short).experience)
    drawn = [remote.generate([prompt], sample=True, attempt=attempt)[0] for attempt in attempts]
    assert len(set(drawn)) > 1  # sampled
    assert drawn == expected  # and seeded like the local draws
    assert remote.generate([prompt], sample=True, attempt=1)[0] == drawn[0]  # the same seed again


def test_a_model_the_server_does_not_serve_is_refused_clearly(served):
    remote = RemoteExperienceModel(_settings(served, "another-model").experience)
    with pytest.raises(ExperienceBackendError, match=r"HTTP 400: .*pinned to .*backend_model 'another-model'"):
        remote.generate(["a", "b"])
