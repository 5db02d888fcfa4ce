"""The OpenAI-compatible API (/v1) through the official ``openai`` client and raw HTTP, on a real
server on 127.0.0.1 (the app's own, beside the page) with a FakeEngine: request shapes, the
speculative figures, errors in OpenAI's shape, stop strings, requests stored as sessions,
the shared engine queue and disconnects. The real tiny coder is in test_api_engine.py."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import httpx
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import openai  # noqa: E402

from tests.fake_engine import DEFAULT_TEXT, FakeEngine, FakeReply, fake_studio  # noqa: E402

HI = [{"role": "user", "content": "hi"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(studio, **overrides):
    studio.host.start().result(timeout=10)
    studio.demo.launch(**studio.launch_kwargs(server_port=free_port(), prevent_thread_lock=True, quiet=True,
                                              inbrowser=False, **overrides))
    return studio.demo.local_url.rstrip("/")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    engine = FakeEngine(delay_s=0.002)
    studio = fake_studio(engine, db_path=tmp_path_factory.mktemp("db") / "sessions.db")
    url = launch(studio)
    yield studio, engine, url
    studio.close()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[2] + "/v1", api_key="unused-on-loopback", max_retries=0)


def sse_events(response: httpx.Response) -> list:
    """Server-sent events parsed by hand: 'data: ...' lines separated by blank lines."""
    events, data = [], []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data.append(line[len("data: "):])
        elif line == "" and data:
            payload = "\n".join(data)
            events.append(payload if payload == "[DONE]" else json.loads(payload))
            data = []
        else:
            assert line == "" or line.startswith(":"), f"not SSE: {line!r}"
    return events


def test_models_and_health(served, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-coder", "incompatible-pair"]  # every pair, the loaded one first
    assert [m.model_extra["dflash"]["loaded"] for m in models.data] == [True, False]
    assert client.models.retrieve("fake-coder").id == "fake-coder"
    health = httpx.get(served[2] + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_chat_not_streamed_with_speculative_usage(served, client):
    studio, engine, _ = served
    engine.enqueue(FakeReply("def f():\n    return 42\n", accept=(2, 4)))
    reply = client.chat.completions.create(model="fake-coder", messages=HI, max_tokens=100)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.choices[0].message.content == "def f():\n    return 42\n"
    assert reply.choices[0].finish_reason == "stop"
    details = reply.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    dflash = reply.model_extra["dflash"]
    assert dflash["block_size"] == 8 and dflash["acceptance_lengths"][:2] == [3, 5]
    assert dflash["mean_acceptance_length"] == pytest.approx(sum(dflash["acceptance_lengths"]) / dflash["cycles"], abs=1e-4)
    assert dflash["accepted_tokens"] == details.accepted_prediction_tokens
    assert engine.calls[-1]["sampling"].max_new_tokens == 100


def test_chat_streamed_through_the_official_client(served, client):
    studio, engine, _ = served
    stream = client.chat.completions.create(model="fake-coder", messages=HI, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == DEFAULT_TEXT
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens > 0
    origins = [o for c in chunks if c.choices for o in c.model_extra["dflash"].get("origins", [])]
    assert origins[0] == "prefill" and {"accepted", "bonus"} <= set(origins)
    changes = chunks[-2].model_extra["dflash"]["fallback_changes"]
    assert changes and changes[0]["cycle"] == 4 and "block 8 → 4" in changes[0]["reason"]


def test_raw_sse_parsed_by_hand(served):
    body = {"model": "fake-coder", "messages": HI, "stream": True}
    with httpx.stream("POST", served[2] + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == DEFAULT_TEXT
    assert [c["choices"][0]["finish_reason"] for c in chunks].count("stop") == 1
    assert "usage" not in chunks[-1]  # only with stream_options.include_usage
    cycles = [c["dflash"]["cycle"] for c in chunks[:-1]]
    assert cycles == list(range(len(cycles)))  # one chunk per verified block, in order
    for chunk in chunks[1:-1]:
        origins = chunk["dflash"]["origins"]
        assert origins == ["accepted"] * chunk["dflash"]["accepted"] + ["bonus"][: len(origins) - chunk["dflash"]["accepted"]]


def test_completions_streamed_and_not(served, client):
    studio, engine, _ = served
    engine.enqueue(FakeReply("    return a + b\n"), FakeReply("    return a + b\n"))
    whole = client.completions.create(model="fake-coder", prompt="def add(a, b):\n", max_tokens=50)
    assert whole.object == "text_completion" and whole.choices[0].text == "    return a + b\n"
    assert engine.last_prompt == "def add(a, b):\n"  # raw text, no chat template
    streamed = list(client.completions.create(model="fake-coder", prompt="def add(a, b):\n", stream=True))
    assert "".join(c.choices[0].text for c in streamed) == "    return a + b\n"
    assert streamed[-1].choices[0].finish_reason == "stop" and streamed[-1].object == "text_completion"


def test_an_imported_completions_session_with_a_naive_time_does_not_break_completions(served, client):
    """Export files are text: a hand-edited time without a zone once made every completion a 500."""
    studio, engine, _ = served
    engine.enqueue(FakeReply("    pass\n"), FakeReply("    pass\n"))
    client.completions.create(model="fake-coder", prompt="def f():\n", max_tokens=8)
    session = next(s for s in studio.store.list_sessions() if s["settings"].get("endpoint") == "completions")
    document = studio.store.export_session(session["id"])
    document["sessions"][0]["updated_at"] = "2030-01-01 00:00:00"
    studio.store.delete_session(session["id"])
    studio.store.import_document(document)
    assert client.completions.create(model="fake-coder", prompt="def g():\n", max_tokens=8).choices[0].text


def test_max_tokens_gives_finish_reason_length(client):
    reply = client.chat.completions.create(model="fake-coder", messages=HI, max_completion_tokens=5)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 5


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_end_the_reply_before_them(served, client, stream):
    studio, engine, _ = served
    engine.enqueue(FakeReply("alpha beta\n\nclass Gamma:\n    pass\n", accept=(1, 1, 1, 1, 1)))
    reply = client.chat.completions.create(model="fake-coder", messages=[{"role": "user", "content": "s"}],
                                           stop=["\nclass", "zzz"], stream=stream)
    if stream:
        chunks = list(reply)
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert (text, finish) == ("alpha beta\n", "stop")
    session = studio.store.list_sessions(limit=1)[0]
    stored = studio.store.get_messages(session["id"])[-1]
    assert (stored["content"], stored["status"], stored["finish_reason"]) == ("alpha beta\n", "complete", "stop")


def test_a_reply_cut_to_nothing_by_a_stop_string_is_stored_as_the_client_got_it(served, client):
    studio, engine, _ = served
    engine.enqueue(FakeReply("\n\nclass Gamma:\n    pass\n", accept=(1, 1, 1, 1, 1)))
    reply = client.chat.completions.create(model="fake-coder", messages=[{"role": "user", "content": "cut"}],
                                           stop=["\n\nclass"])
    assert (reply.choices[0].message.content, reply.choices[0].finish_reason) == ("", "stop")
    stored = studio.store.get_messages(studio.store.list_sessions(limit=1)[0]["id"])[-1]
    assert (stored["content"], stored["finish_reason"]) == ("", "stop")


@pytest.mark.parametrize("body, param, words", [
    ({"n": 2}, "n", "only one choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "tools"),
    ({"logprobs": True}, "logprobs", "logprobs"),
    ({"frequency_penalty": 0.5}, "frequency_penalty", "frequency_penalty"),
    ({"response_format": {"type": "json_object"}}, "response_format", "response_format"),
    ({"bogus_option": 1}, "bogus_option", "Unrecognized request argument"),
    ({"temperature": 3}, "temperature", "less than or equal to 2"),
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"stop": [f"s{i}" for i in range(17)]}, "stop", "at most 16"),
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "tool"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]", "only text parts"),
    ({"model": "gpt-4o"}, "model", "does not exist"),
])
def test_unsupported_or_invalid_requests_get_an_openai_shaped_400(served, client, body, param, words):
    request = {"model": "fake-coder", "messages": HI, **body}
    status = 404 if param == "model" else 400
    response = httpx.post(served[2] + "/v1/chat/completions", json=request)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"]
    with pytest.raises(openai.APIStatusError) as raised:  # the client surfaces the same message
        client.chat.completions.create(model=request["model"], messages=request["messages"],
                                       extra_body={k: v for k, v in body.items() if k not in ("model", "messages")})
    assert raised.value.status_code == status and words in raised.value.message


def test_harmless_defaults_of_unsupported_parameters_are_accepted(client):
    reply = client.chat.completions.create(model="fake-coder", messages=HI, n=1, frequency_penalty=0,
                                           presence_penalty=0.0, logprobs=False, response_format={"type": "text"},
                                           user="me", max_tokens=3)
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize("method, path, body, status", [
    ("POST", "/v1/nothing-here", {}, 404),
    ("GET", "/v1/chat/completions", None, 405),
    ("POST", "/v1/chat/completions", b"{not json", 400),
    ("POST", "/v1/chat/completions", b"[1, 2]", 400),
    ("POST", "/v1/completions", {"prompt": ["a", "b"]}, 400),
    ("POST", "/v1/completions", {"prompt": [1, 2, 3]}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "suffix": "y"}, 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400),
])
def test_errors_are_always_openai_shaped(served, method, path, body, status):
    kwargs = {"json": body} if isinstance(body, dict) else {"content": body,
                                                             "headers": {"content-type": "application/json"}}
    response = httpx.request(method, served[2] + path, **({} if body is None else kwargs))
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["message"]


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2, 3]]])
def test_a_token_id_prompt_is_refused_with_the_reason(served, client, prompt):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="fake-coder", prompt=prompt, max_tokens=4)
    assert raised.value.message.endswith("prompt: token-id prompts are not supported by this server: send the "
                                         "prompt as text")


def test_a_prompt_over_the_context_window_is_refused_before_it_is_stored(served, client):
    studio, engine, _ = served
    before = studio.store.count_sessions()
    with pytest.raises(openai.BadRequestError, match="context window") as raised:
        client.chat.completions.create(model="fake-coder", messages=[{"role": "user", "content": "word " * 5000}])
    assert raised.value.code == "context_length_exceeded"
    assert studio.store.count_sessions() == before


def test_requests_are_sessions_and_a_conversation_continues_its_own(served, client):
    studio, engine, _ = served
    engine.enqueue(FakeReply("first answer"), FakeReply("second answer"))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "question one"}]
    first = client.chat.completions.create(model="fake-coder", messages=messages, temperature=0.5, seed=7,
                                           max_tokens=40, user="editor")
    session = studio.store.list_sessions(limit=1)[0]
    assert session["title"] == "API · question one" and session["settings"]["source"] == "api"
    assert session["settings"]["client"] == {"model": "fake-coder", "temperature": 0.5, "seed": 7,
                                             "max_tokens": 40, "user": "editor"}
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "question two"}]
    client.chat.completions.create(model="fake-coder", messages=messages, max_tokens=40)
    assert studio.store.list_sessions(limit=1)[0]["id"] == session["id"]
    stored = studio.store.get_messages(session["id"])
    assert [(m["role"], m["content"]) for m in stored] == [
        ("system", "be brief"), ("user", "question one"), ("assistant", "first answer"),
        ("user", "question two"), ("assistant", "second answer")]
    reply = stored[-1]
    assert reply["status"] == "complete" and reply["settings"]["source"] == "api"
    assert len(studio.store.get_cycles(reply["id"])) > 0  # the cycles, for the charts and teach replay


def test_api_and_page_share_the_one_engine_in_order(served, client):
    studio, engine, url = served
    engine.max_concurrent = 0
    results = []

    def ask(i):
        reply = client.chat.completions.create(model="fake-coder", messages=[{"role": "user", "content": f"q{i}"}],
                                               max_tokens=20)
        results.append(reply.choices[0].finish_reason)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == ["length"] * 4 and engine.max_concurrent == 1


def _wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_cancels_its_generation_within_a_cycle(served, stream):
    studio, engine, url = served
    engine.enqueue(FakeReply("tok " * 400, delay_s=0.05))
    body = {"model": "fake-coder", "messages": [{"role": "user", "content": f"long {stream}"}],
            "max_tokens": 800, "stream": stream}
    with httpx.Client(timeout=30) as http:
        if stream:
            with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")
        else:
            with pytest.raises(httpx.ReadTimeout):
                http.post(url + "/v1/chat/completions", json=body, timeout=0.6)
    gone = time.monotonic()
    assert _wait_until(lambda: not engine.running.is_set())
    assert time.monotonic() - gone < 0.05 * 4 + 0.5 + 1.0  # a cycle, the disconnect poll, slack for a busy CPU
    session = studio.store.list_sessions(limit=1)[0]
    reply = studio.store.get_messages(session["id"])[-1]
    assert reply["status"] == "interrupted" and 0 < len(reply["content"]) < len("tok " * 400)
    assert engine.calls[-1]["sampling"].max_new_tokens == 800


def test_no_store_api_keeps_nothing(tmp_path):
    studio = fake_studio(FakeEngine(), db_path=tmp_path / "s.db", api=_api_config(store=False))
    url = launch(studio)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        assert client.chat.completions.create(model="fake-coder", messages=HI).choices[0].message.content
        assert list(client.chat.completions.create(model="fake-coder", messages=HI, stream=True))
        assert studio.store.count_sessions() == 0
    finally:
        studio.close()


def _api_config(**fields):
    from app.config import ApiConfig

    return ApiConfig(**fields)


def test_an_api_key_is_required_once_given(tmp_path):
    studio = fake_studio(FakeEngine(), api=_api_config(key="s3cret-key"))
    url = launch(studio)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": "Basic s3cret-key"}):
            response = httpx.post(url + "/v1/chat/completions", json={"messages": HI}, headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong-key", max_retries=0).models.list()
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret-key", max_retries=0)
        assert good.chat.completions.create(model="fake-coder", messages=HI).choices[0].finish_reason == "stop"
    finally:
        studio.close()


def test_serve_refuses_a_non_loopback_host_without_an_api_key(capsys):
    from app.cli import main

    assert main(["serve", "--host", "0.0.0.0", "--auth", "me:secret", "--no-browser"]) == 2  # nothing starts
    assert "without a key" in capsys.readouterr().err and "--api-key" in _api_error_text()
    assert main(["serve", "--host", "0.0.0.0", "--auth", "me:secret", "--api-key", "short"]) == 2
    assert "at least 8 characters" in capsys.readouterr().err


def _api_error_text() -> str:
    from app.config import AppConfig
    from engine.errors import InvalidRequestError

    try:
        AppConfig(host="192.168.1.5", auth=("me", "secret")).validate()
    except InvalidRequestError as exc:
        return str(exc)
    return ""


def test_a_non_loopback_bind_needs_the_key_on_v1():
    studio = fake_studio(FakeEngine(), host="0.0.0.0", auth=("me", "secret"), api=_api_config(key="lan-key-123"))
    url = launch(studio)
    try:
        port = url.rsplit(":", 1)[1]
        base = f"http://127.0.0.1:{port}/v1"
        for key in (None, "wrong-key-456"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            response = httpx.post(base + "/chat/completions", json={"messages": HI}, headers=headers)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        client = openai.OpenAI(base_url=base, api_key="lan-key-123", max_retries=0)
        assert client.chat.completions.create(model="fake-coder", messages=HI).choices[0].finish_reason == "stop"
    finally:
        studio.close()


def test_with_a_login_on_the_page_the_api_needs_its_own_key():
    studio = fake_studio(FakeEngine(), auth=("me", "secret"))
    url = launch(studio)
    try:
        response = httpx.get(url + "/v1/models")
        assert response.status_code == 401 and "--api-key" in response.json()["error"]["message"]
    finally:
        studio.close()


def test_the_sessions_panel_refreshes_itself_for_api_requests(served, client):
    from ui.chat import handlers as h

    studio, engine, _ = served
    seen = h.live_refresh(studio.ctx, None, "", None, page="a-page-id")["live_seen"]  # the first look draws the list
    assert set(h.live_refresh(studio.ctx, None, "", seen, page="a-page-id")) == {"live_seen"}  # nothing new: nothing redrawn
    client.chat.completions.create(model="fake-coder", messages=[{"role": "user", "content": "live please"}])
    session = studio.store.list_sessions(limit=1)[0]
    changed = h.live_refresh(studio.ctx, None, "", seen, page="a-page-id")
    assert (session["title"], session["id"]) in [tuple(choice) for choice in changed["sessions"].choices]
    shown = h.live_refresh(studio.ctx, session["id"], "", changed["live_seen"], page="a-page-id")  # the API session, shown
    assert shown["chat"][-1]["role"] == "assistant" and 'data-origin="accepted"' in shown["token_view"]
    assert set(h.live_refresh(studio.ctx, session["id"], "", shown["live_seen"], page="a-page-id")) == {"live_seen"}


def test_odd_paths_under_v1_still_get_openai_errors(served):
    for path in ("/v1/models/%0A0", "/v1/%0A", "/v1", "/v1/models/a%2Fb", "/v1/chat/completions/extra"):
        response = httpx.get(served[2] + path)
        assert response.status_code in (404, 405), path
        assert response.json()["error"]["message"], path


def test_browser_pages_of_other_origins_cannot_use_the_api(served):
    url = served[2]
    host = url.split("//", 1)[1]
    for origin in ("http://localhost:3000", "http://127.0.0.1:1", "https://evil.example", "null"):
        response = httpx.post(url + "/v1/chat/completions", json={"messages": HI}, headers={"Origin": origin})
        assert response.status_code == 403 and response.json()["error"]["message"], origin  # OpenAI's shape
    same = httpx.get(url + "/v1/models", headers={"Origin": f"http://{host}"})
    assert same.status_code == 200  # the Studio page itself


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_failure_mid_reply_is_an_openai_error(served, client, stream):
    studio, engine, _ = served
    engine.enqueue(FakeReply("one two three four five six", accept=(1,), fail_after=2))
    body = {"model": "fake-coder", "messages": [{"role": "user", "content": f"fail {stream}"}], "stream": stream}
    if stream:
        with httpx.stream("POST", served[2] + "/v1/chat/completions", json=body, timeout=30) as response:
            events = sse_events(response)
        assert events[-1] == "[DONE]" and "the fake engine broke on purpose" in events[-2]["error"]["message"]
    else:
        response = httpx.post(served[2] + "/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 500
        assert "the fake engine broke on purpose" in response.json()["error"]["message"]
    reply = studio.store.get_messages(studio.store.list_sessions(limit=1)[0]["id"])[-1]
    assert reply["status"] == "error" and reply["content"]  # the text before the failure is kept


def test_stop_in_the_page_ends_an_api_reply(served):
    studio, engine, url = served
    engine.enqueue(FakeReply("tok " * 300, delay_s=0.03))
    body = {"model": "fake-coder", "messages": [{"role": "user", "content": "stop me from the page"}],
            "stream": True, "max_tokens": 600}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        session = studio.store.list_sessions(limit=1)[0]
        assert studio.replies.stop(session["id"])  # what the page's Stop button does for the session shown
        events = sse_events_from(lines)
    final = events[-2]
    assert final["choices"][0]["finish_reason"] == "stop" and final["dflash"]["cancelled"] is True
    reply = studio.store.get_messages(session["id"])[-1]
    assert reply["status"] == "interrupted" and len(reply["content"]) < len("tok " * 300)


def sse_events_from(lines) -> list:
    class Lines:
        def iter_lines(self):
            return lines

    return sse_events(Lines())


def test_no_api_serves_no_v1():
    studio = fake_studio(FakeEngine(), api=_api_config(enabled=False))
    url = launch(studio)
    try:
        assert studio.api is None
        assert httpx.get(url + "/v1/models").status_code == 404
        assert httpx.get(url + "/health").status_code == 404
    finally:
        studio.close()


def test_an_engine_without_rejected_drafts_leaves_them_out(tmp_path):
    """The vLLM engine's capabilities: rejected drafts unknown, no per-request block size or fallback."""
    from engine.interface import Capabilities

    engine = FakeEngine()
    engine.capabilities = Capabilities(kind="vllm", rejected_drafts=False, block_size_choice=False, fallback=False)
    studio = fake_studio(engine)
    url = launch(studio)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="fake-coder", messages=HI)
        details = reply.usage.completion_tokens_details
        assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens is None
        assert reply.model_extra["dflash"]["rejected_tokens"] is None
        for extra in ({"block_size": 4}, {"fallback": True}):
            with pytest.raises(openai.BadRequestError, match="not supported by the vllm engine"):
                client.chat.completions.create(model="fake-coder", messages=HI, extra_body=extra)
    finally:
        studio.close()
