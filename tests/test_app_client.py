"""The app's API through ``gradio_client`` (every UI event is also an endpoint), on a real
server on 127.0.0.1 with a FakeEngine: the same checks apply to scripts as to the page."""

from __future__ import annotations

import os
import socket
import threading

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from gradio_client import Client  # noqa: E402

from tests.fake_engine import FakeEngine, FakeReply, fake_studio  # noqa: E402

SETTINGS = dict(block_size=8, temperature=0.0, top_p=1.0, max_new_tokens=256, fallback=True, show_rejected=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    engine = FakeEngine(delay_s=0.01)
    studio = fake_studio(engine, db_path=tmp_path_factory.mktemp("db") / "sessions.db")
    studio.host.start().result(timeout=10)
    studio.demo.launch(**studio.launch_kwargs(server_port=free_port(), prevent_thread_lock=True, quiet=True,
                                              inbrowser=False))
    yield studio, engine
    studio.close()


@pytest.fixture
def client(served):
    return Client(served[0].demo.local_url, verbose=False)


def test_the_server_listens_on_loopback_only(served):
    assert served[0].demo.local_url.startswith("http://127.0.0.1:")
    assert served[0].demo.share_url is None


def test_send_then_respond_streams_a_reply_that_is_stored(served, client):
    studio, engine = served
    engine.enqueue(FakeReply("def f():\n    return 42\n", accept=(2, 4)))
    client.predict(**SETTINGS, api_name="/settings")  # the page's six controls, as one Settings value
    sent = client.predict("write f", api_name="/send")
    assert sent[-1] == "write f"  # the session title
    job = client.submit(api_name="/respond")
    outputs = list(job)
    assert len(outputs) >= 2
    final = job.outputs()[-1]
    chat, token_view = final[0], final[1]
    assert 'data-origin="accepted"' in token_view and 'data-origin="bonus"' in token_view
    assert chat[-1]["role"] == "assistant"
    session = studio.store.list_sessions()[0]
    reply = studio.store.get_messages(session["id"])[-1]
    assert (reply["role"], reply["status"], reply["content"]) == ("assistant", "complete", "def f():\n    return 42\n")


def test_invalid_settings_through_the_api_get_a_clear_error(client):
    with pytest.raises(Exception, match="greater than maximum value 2.0"):  # the slider's own bounds, server-side
        client.predict(**{**SETTINGS, "temperature": 50.0}, api_name="/settings")
    with pytest.raises(Exception, match="The prompt is empty"):
        client.predict("   ", api_name="/send")
    with pytest.raises(Exception, match="Nothing to answer"):  # nothing was sent on this client
        client.predict(api_name="/respond")


def test_concurrent_requests_queue_behind_the_one_engine(served):
    studio, engine = served
    engine.delay_s = 0.02
    results = []

    def one(i):
        c = Client(studio.demo.local_url, verbose=False)
        c.predict(**SETTINGS, api_name="/settings")
        c.predict(f"question {i}", api_name="/send")
        results.append(c.predict(api_name="/respond"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    engine.delay_s = 0.01
    assert len(results) == 3 and engine.max_concurrent == 1
    assert all('data-origin="bonus"' in r[1] for r in results)


def test_load_session_restores_the_latest_session_from_the_database(served, client):
    studio, _ = served
    client.predict("the latest one", api_name="/send")
    client.predict(api_name="/respond")
    view = Client(studio.demo.local_url, verbose=False).predict(None, api_name="/load_session")  # a new page
    assert view[3] == "the latest one" == studio.store.list_sessions()[0]["title"]  # (browser id, chat, list, title, …)
    assert view[2]["value"] == studio.store.list_sessions()[0]["id"]


def test_streamed_replies_leave_the_page_session_state_the_same_size(served, client):
    """Gradio 6 keeps a copy of an output's value in the page's session state each time an output
    it was told to leave unchanged (``gr.skip()``) then gets a value, until the page closes. A
    streaming reply redraws its charts at most every ``chart_interval_s``: were they skipped in
    between, every reply would leave copies of them behind (a long-lived tab's memory grows)."""
    studio, engine = served
    client.predict(**SETTINGS, api_name="/settings")

    def one_reply() -> int:
        engine.enqueue(FakeReply(" ".join(f"w{i}" for i in range(90)), accept=(1,), delay_s=0.03))
        client.predict("a long one", api_name="/send")
        client.predict(api_name="/respond")  # about 1.4 s: three chart redraws and updates between
        state = studio.demo.state_holder[client.session_hash]
        return len(state.blocks_config.blocks) + len(state.config_values)

    sizes = [one_reply() for _ in range(3)]
    assert sizes[2] == sizes[1] == sizes[0], sizes
