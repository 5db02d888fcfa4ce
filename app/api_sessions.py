"""API requests as stored sessions, like chats in the page.

A chat request whose messages begin with a stored API conversation (the same roles and texts,
its last reply included) continues that session: only the new messages are added. Otherwise a
new session titled "API · <first user message>" holds the request's messages. Text completions
(editor autocompletion sends one per pause in typing) go to one rolling "API · completions"
session, a new one after an hour without requests. Sessions and messages carry
``settings["source"] == "api"`` and the client's parameters under ``settings["client"]``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from storage.records import API_SOURCE

from .api_reasoning import chat_settings
from .api_requests import ApiRequest

TITLE_PREFIX = "API · "
TITLE_CHARS = 48
COMPLETIONS_TITLE = "API · completions"
CANDIDATES = 20  # recent API sessions compared when looking for the conversation a request continues
COMPLETIONS_IDLE = timedelta(hours=1)


def reply_settings(request: ApiRequest, model_key: str, block_size: int, endpoint: str) -> dict:
    """Settings stored with the session and its messages: the page's controls show them, and
    the client's own parameters are kept as sent."""
    sampling = request.sampling
    settings = {
        "source": API_SOURCE, "endpoint": endpoint, "model": model_key, "block_size": int(block_size),
        "temperature": sampling.temperature, "top_p": sampling.top_p, "max_new_tokens": sampling.max_new_tokens,
        "fallback": request.fallback.enabled, "client": request.params,
    }
    if sampling.seed is not None:
        settings["seed"] = sampling.seed
    if request.stop:
        settings["stop"] = list(request.stop)
    settings.update(chat_settings(request.params))  # thinking, reasoning effort: how the template renders it
    return settings


def _title(text: str) -> str:
    line = " ".join(text.split()) or "(empty)"
    room = TITLE_CHARS - len(TITLE_PREFIX)
    return TITLE_PREFIX + (line[: room - 1] + "…" if len(line) > room else line)


def _conversation(store, session_id: int) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in store.get_messages(session_id) if m["kind"] == "chat"]


def find_conversation(store, messages: list[dict]) -> tuple[int, int] | None:
    """The recent API session whose messages are the start of ``messages`` (ending with a
    reply), and how many of them it already holds."""
    wanted = [(m["role"], m["content"]) for m in messages]
    api_sessions = [s for s in store.list_sessions(limit=CANDIDATES * 5) if s.from_api]
    for session in api_sessions[:CANDIDATES]:
        if session["settings"].get("endpoint") != "chat.completions":
            continue
        stored = _conversation(store, session["id"])
        if stored and stored[-1][0] == "assistant" and len(stored) < len(wanted) and wanted[: len(stored)] == stored:
            return session["id"], len(stored)
    return None


def _recent_completions_session(store) -> int | None:
    for session in store.list_sessions(limit=CANDIDATES * 5):
        if session.from_api and session["settings"].get("endpoint") == "completions":
            try:  # an imported session's time comes from a file: naive, or not a time at all
                updated = datetime.fromisoformat(session["updated_at"])
            except (TypeError, ValueError):
                return None
            if updated.tzinfo is None:
                updated = updated.replace(tzinfo=timezone.utc)
            if datetime.now(timezone.utc) - updated < COMPLETIONS_IDLE:
                return session["id"]
            return None
    return None


def store_request(store, request: ApiRequest, settings: dict) -> int:
    """Store the request's new messages (committed before generation starts); return the session."""
    if request.kind == "complete":
        session_id = _recent_completions_session(store)
        if session_id is None:
            session_id = store.create_session(COMPLETIONS_TITLE, model=settings["model"], settings=settings)
        else:
            store.update_session_settings(session_id, settings)
        store.add_message(session_id, "user", request.prompt, kind="complete", settings=settings)
        return session_id
    messages = request.prompt
    found = find_conversation(store, messages)
    if found is None:
        first_user = next((m["content"] for m in messages if m["role"] == "user"), messages[-1]["content"])
        session_id, held = store.create_session(_title(first_user), model=settings["model"], settings=settings), 0
    else:
        session_id, held = found
        store.update_session_settings(session_id, settings)
    for message in messages[held:]:
        store.add_message(session_id, message["role"], message["content"], kind="chat", settings=settings)
    return session_id
