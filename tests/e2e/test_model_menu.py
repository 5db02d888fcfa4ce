"""The model menu tells the truth in a real browser: after a pick, a reload, "+ New session" and
each stored session show the model that answers there; opening a session shows its model, and
Send runs it; where a session's model changed, the chat says so and the new model is not sent
the other model's turns."""

from __future__ import annotations

import pytest

from tests.fake_engine import FakeEngine, FakeReply, fake_studio

from .conftest import launch, opened_page
from .test_browser import send, wait_replies

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    coder, fast = FakeEngine("fake-coder", delay_s=0.01), FakeEngine("fake-fast", delay_s=0.01)
    studio = fake_studio(coder, db_path=tmp_path_factory.mktemp("menu") / "sessions.db", others=(fast,))
    studio.host.start().result(timeout=10)
    url = launch(studio)
    yield studio, coder, fast, url
    studio.close()


@pytest.fixture
def page(browser, two_models):
    """A page of its own, loaded, as a visitor opens it (closed after the test, pass or fail)."""
    with opened_page(browser, two_models[3]) as page:
        yield page


def menu_value(page) -> str:
    return page.locator("#model-picker input").input_value()


def wait_menu(page, name: str) -> None:
    page.wait_for_function(f"document.querySelector('#model-picker input').value === {name!r}")


def pick(page, name: str) -> None:
    page.click("#model-picker input")
    page.locator(f"#model-picker li[role=option][aria-label='{name}']").click()


def header_model(page, name: str, state: str) -> None:
    page.wait_for_selector(f"#model-status [data-model='{name}'][data-state='{state}']", timeout=20_000)


def test_menu_header_and_sessions_name_the_model_that_answers(page, two_models):
    studio, coder, fast, _ = two_models
    header_model(page, "fake-coder", "ready")
    send(page, "first, on the coder")
    wait_replies(page, 1)

    page.click("#new-session")
    wait_menu(page, "fake-coder")
    pick(page, "fake-fast")  # picked on a new page: it loads, and the next session is made with it
    header_model(page, "fake-fast", "ready")
    page.click("#session-list label >> nth=1")  # open the older chat in the list, then make a new one
    wait_menu(page, "fake-coder")
    page.click("#new-session")
    wait_menu(page, "fake-fast")  # a new session: the model that is loaded and answers
    fast.enqueue("Fast answer.")
    send(page, "second, on the fast one")
    page.wait_for_function("document.querySelector('#chat').innerText.includes('Fast answer.')")
    assert len(fast.calls) == 1 and "second, on the fast one" in fast.calls[-1]["prompt_text"]

    page.reload()  # the page remembers the fast session, and its model
    page.wait_for_selector("#chat-input textarea:not([disabled])")
    page.wait_for_function("document.querySelector('#chat').innerText.includes('Fast answer.')")
    wait_menu(page, "fake-fast")

    page.locator("#session-list label", has_text="first, on the coder").click()  # an older session: its model
    wait_menu(page, "fake-coder")
    header_model(page, "fake-coder", "on-send")
    page.wait_for_function("document.querySelector('#model-status').innerText.includes('loads when you send')")
    page.wait_for_timeout(1500)  # the header stays so (it is redrawn every second)
    assert "fake-coder" in page.locator("#model-status").inner_text() and "loads when you send" in page.locator("#model-status").inner_text()
    calls = len(coder.calls)
    coder.enqueue("Coder again.")
    send(page, "third, back on the coder")
    page.wait_for_function("document.querySelector('#chat').innerText.includes('Coder again.')")
    assert len(coder.calls) == calls + 1 and len(fast.calls) == 1  # Send ran the session's model
    header_model(page, "fake-coder", "ready")
    assert "fake-fast" not in page.locator("#chat").inner_text()  # no change in this session
    stored = [s for s in studio.store.list_sessions() if s["title"].startswith("first")][0]
    assert stored["settings"]["model"] == "fake-coder"


def test_a_model_change_mid_session_is_said_in_the_chat_and_keeps_each_history_apart(page, two_models):
    studio, coder, fast, _ = two_models
    page.click("#new-session")
    pick(page, "fake-coder")
    header_model(page, "fake-coder", "ready")
    coder.enqueue(FakeReply("class Tkinter: pass"))
    send(page, "write add(a, b)")
    wait_replies(page, 1)
    pick(page, "fake-fast")
    header_model(page, "fake-fast", "ready")
    fast.enqueue("def is_even(n): return n % 2 == 0")
    send(page, "write is_even(n)")
    notice = page.locator("#chat .model-change")
    notice.wait_for()
    assert "fake-coder → fake-fast" in notice.inner_text() and "1 earlier turn" in notice.inner_text()
    wait_replies(page, 2)
    prompt = fast.calls[-1]["prompt_text"]
    assert "write is_even(n)" in prompt and "Tkinter" not in prompt and "write add" not in prompt
    page.reload()  # the notice is part of the stored chat, not of the stream only
    page.wait_for_selector("#chat .model-change")
    assert page.locator("#chat .model-change").count() == 1


def test_an_empty_chat_offers_example_requests_and_a_click_sends_one(page, two_models):
    studio, coder, fast, _ = two_models
    from ui.layout import EXAMPLE_REQUESTS

    page.click("#new-session")
    page.wait_for_function("!document.querySelector('#chat .message')")
    example = page.locator("#chat button", has_text=EXAMPLE_REQUESTS[1])
    assert page.locator("#chat button", has_text=EXAMPLE_REQUESTS[0]).count() == 1 and example.count() == 1
    example.click()
    wait_replies(page, 1)
    session = studio.store.list_sessions(limit=1)[0]
    assert studio.store.get_messages(session["id"])[0]["content"] == EXAMPLE_REQUESTS[1]
    assert page.locator("#chat button", has_text=EXAMPLE_REQUESTS[0]).count() == 0  # gone once the chat has begun


def test_a_refused_pick_warns_once_and_the_warning_goes_once_the_loaded_model_answers(page, two_models):
    studio, coder, fast, _ = two_models
    page.click("#new-session")
    loaded = menu_value(page)
    pick(page, "incompatible-pair")  # one mouse pick: one report, one warning
    page.wait_for_function("document.querySelector('#model-status').innerText.includes('hidden size 64')")
    page.wait_for_timeout(1500)  # a second report would have arrived by now
    toasts = [t for t in page.locator(".toast-body").all_inner_texts() if "Cannot use incompatible-pair" in t]
    assert len(toasts) == 1 and "(2)" not in toasts[0]
    wait_menu(page, loaded)  # the menu goes back to the model that answers
    send(page, "answered by the loaded model")
    wait_replies(page, 1)
    page.wait_for_function("!document.querySelector('#model-status').innerText.includes('hidden size 64')")


def test_opening_another_session_while_a_pick_loads_leaves_that_session_on_its_model(browser, tmp_path):
    """The menu reports a pick once: Gradio's dropdown fires ``input`` again when it loses focus,
    and a click on another session in the list, made while the picked model loads, moved that
    session to the picked model (its menu still said the old one)."""
    coder, fast = FakeEngine("fake-coder", delay_s=0.01), FakeEngine("fake-fast", delay_s=0.01)
    studio = fake_studio(coder, db_path=tmp_path / "sessions.db", others=(fast,), load_delay_s=1.5)
    studio.host.start().result(timeout=10)
    try:
        with opened_page(browser, launch(studio)) as page:
            header_model(page, "fake-coder", "ready")
            send(page, "first, on the coder")
            wait_replies(page, 1)
            page.click("#new-session")
            pick(page, "fake-fast")
            page.locator("#session-list label", has_text="first, on the coder").click()  # while it loads
            wait_menu(page, "fake-coder")
            header_model(page, "fake-coder", "on-send")  # fake-fast is loaded; this session loads its own
            page.wait_for_timeout(1500)
            first = [s for s in studio.store.list_sessions() if s["title"].startswith("first")][0]
            assert first["settings"]["model"] == "fake-coder" and menu_value(page) == "fake-coder"
    finally:
        studio.close()
