"""`dflash-studio serve` with the embedded tiny coder, used the way an editor uses it: the
official ``openai`` client streams a greedy chat reply that is exactly `dflash-studio generate`'s
for the same prompt, with the speculative counts in ``usage``, and the request shows up in the
session store as an API session with its cycles."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from storage import SessionStore
from tests.test_network import end_process

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PROMPT = "Write a Python function that returns the sum of a list."
CODE = "def is_even(n):\n"
TOKENS = 48


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", *args]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_ANALYTICS_ENABLED": "False"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("api-engine") / "sessions.db"
    port = free_port()
    log = open(db.parent / "serve.log", "w")
    process = subprocess.Popen(cli("serve", "--port", str(port), "--no-browser", "--db", str(db)), cwd=REPO,
                               env=env(), stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert process.poll() is None, (db.parent / "serve.log").read_text()
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("the server did not load the model in 180 s")
        yield base, db
    finally:
        end_process(process)
        log.close()


def generate(*args: str) -> dict:
    done = subprocess.run(cli("generate", "--json", "--max-new-tokens", str(TOKENS), *args), cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_streamed_greedy_chat_equals_generate(server):
    base, db = server
    client = openai.OpenAI(base_url=base + "/v1", api_key="not-needed-on-loopback", max_retries=0)
    model = client.models.list().data[0].id
    assert model == "tiny-coder"  # the default pair, loaded, listed first
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}],
                                            temperature=0, max_tokens=TOKENS, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"fallback": False})  # fixed blocks, as generate's default
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected = generate(PROMPT)
    assert text == expected["text"]
    usage = chunks[-1].usage
    assert usage.completion_tokens == expected["tokens"] and usage.prompt_tokens == expected["prompt_tokens"]
    assert usage.completion_tokens_details.accepted_prediction_tokens > 0
    final = chunks[-2].model_extra["dflash"]
    assert final["acceptance_lengths"] == expected["acceptance_lengths"]
    with SessionStore(db, recover=False) as store:
        session = store.list_sessions(limit=1)[0]
        assert session["settings"]["source"] == "api" and session["title"].startswith("API · Write a Python")
        reply = store.get_messages(session["id"])[-1]
        assert (reply["role"], reply["status"], reply["content"]) == ("assistant", "complete", text)
        assert len(store.get_cycles(reply["id"])) == len(expected["acceptance_lengths"])


def test_greedy_text_completion_equals_generate_raw(server):
    base, _ = server
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    reply = client.completions.create(model="tiny-coder", prompt=CODE, temperature=0, max_tokens=TOKENS)
    assert reply.choices[0].text == generate("--raw", CODE)["text"]
