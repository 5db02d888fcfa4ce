"""Every pair the Studio can run, through the official ``openai`` client: /v1/models lists the
pair given by paths (by a readable id), the shipped pairs and the ``--models-dir`` ones, and a
request naming any of them (or an older name of one) runs on it: the Studio loads it on the
engine worker, after the reply that runs, as LM Studio and Ollama do. FakeEngines stand in for
the models (the real default pair is in test_api_engine.py)."""

from __future__ import annotations

import os
import threading

import openai
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app.config import AppConfig  # noqa: E402
from app.api import model_id  # noqa: E402
from app.wiring import available_models, build_studio  # noqa: E402
from engine.catalog import PUBLISHED_PAIRS  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from storage import SessionStore  # noqa: E402
from tests.fake_engine import FakeEngine, FakeReply  # noqa: E402
from tests.test_api import launch  # noqa: E402

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    for folder in ("mypair", "models/qwen-8b"):
        (root / folder / "target").mkdir(parents=True)
        (root / folder / "draft").mkdir()
    config = AppConfig(engine=EngineConfig(target=str(root / "mypair" / "target"), draft=str(root / "mypair" / "draft")),
                       models_dir=root / "models", open_browser=False, flush_interval_s=0.2)
    catalog = available_models(config)
    engines = {choice.key: FakeEngine(name=choice.key, delay_s=0.002) for choice in catalog}
    loads: list[tuple[str, bool]] = []  # (pair, whether a reply was running when it loaded)

    def loader(choice, progress):
        loads.append((choice.key, any(e.running.is_set() for e in engines.values())))
        return engines[choice.key]

    studio = build_studio(config, store=SessionStore(), loader=loader, catalog=catalog)
    url = launch(studio)
    yield studio, engines, loads, url
    studio.close()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[3] + "/v1", api_key="unused-on-loopback", max_retries=0)


def test_models_lists_every_pair_by_a_readable_id(served, client):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "mypair"  # the pair given by --target/--draft paths: loaded, listed first, not 'target-+-draft'
    published = [model_id(pair.name) for pair in PUBLISHED_PAIRS]  # the published pairs, after the local ones
    assert sorted(ids[1:-len(published)]) == ["qwen-8b", "tiny-coder", "tiny-coder-fast"] and ids[-len(published):] == published
    cards = {m.id: m.model_extra["dflash"] for m in client.models.list().data}
    assert cards["tiny-coder"]["purpose"] == "answers simple requests" and cards["mypair"]["loaded"] is True
    assert cards["tiny-coder-fast"]["loaded"] is False
    assert client.models.retrieve("qwen-8b").id == "qwen-8b"


def test_a_request_naming_another_pair_switches_to_it_after_the_running_reply(served, client):
    studio, engines, loads, _ = served
    long_text = " ".join(f"w{i}" for i in range(120))
    engines["mypair"].enqueue(FakeReply(long_text, accept=(1,), fallback_at={}, delay_s=0.02))
    first: dict = {}

    def run_first():
        reply = client.chat.completions.create(model="mypair", messages=HI, max_tokens=500)
        first["text"], first["model"] = reply.choices[0].message.content, reply.model

    thread = threading.Thread(target=run_first)
    thread.start()
    assert engines["mypair"].running.wait(10)
    reply = client.chat.completions.create(model="tiny-coder-fast", messages=[{"role": "user", "content": "fast"}])
    thread.join(30)
    assert first == {"text": long_text, "model": "mypair"}  # the running reply finished on its own pair
    assert reply.model == "tiny-coder-fast" and len(engines["tiny-coder-fast"].calls) == 1
    assert ("tiny-coder-fast", False) in loads  # loaded once the running reply had ended
    assert studio.host.current_key == "tiny-coder-fast"
    assert [m.id for m in client.models.list().data][0] == "tiny-coder-fast"
    session = studio.store.list_sessions(limit=1)[0]
    assert session["model"] == "tiny-coder-fast" and session["settings"]["model"] == "tiny-coder-fast"


def test_older_names_reach_the_pair_they_meant(served, client):
    """Editors configured before the rename keep working: 'tiny-coder-embedded' was the speed demo,
    'tiny-coder-requests' the pair that answers."""
    studio, engines, _, _ = served
    assert client.chat.completions.create(model="tiny-coder-embedded", messages=HI).model == "tiny-coder-fast"
    assert client.completions.create(model="tiny-coder-requests", prompt="def f():").model == "tiny-coder"
    assert len(engines["tiny-coder"].calls) == 1
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert "tiny-coder-fast" in str(refused.value) and "qwen-8b" in str(refused.value)
