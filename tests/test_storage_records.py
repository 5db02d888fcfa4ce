"""The store hands out frozen records: typed attributes, read-only mapping access."""

import dataclasses

import pytest

from storage import Message, Session, SessionStore


@pytest.fixture
def store():
    with SessionStore(":memory:") as store:
        yield store


def test_sessions_and_messages_are_frozen_records_that_still_read_like_rows(store):
    session_id = store.create_session("hello", settings={"block_size": 8})
    store.add_message(session_id, "user", "write f")
    session, message = store.get_session(session_id), store.get_messages(session_id)[0]
    assert isinstance(session, Session) and isinstance(message, Message)
    assert (session.title, session.settings, session.message_count) == ("hello", {"block_size": 8}, 1)
    assert (message.role, message.content, message.seq) == ("user", "write f", 1)
    assert message["role"] == "user" and dict(message)["content"] == "write f" and "kind" in message
    assert store.get_session(session_id) == dict(session)  # equal to the row it describes
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.content = "changed"  # edits go through the store
    with pytest.raises(TypeError):
        message["content"] = "changed"
    with pytest.raises(KeyError):
        message["nope"]
