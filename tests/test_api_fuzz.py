"""Schema-driven fuzzing of the OpenAI-compatible API: schemathesis reads the server's own
/v1/openapi.json and Hypothesis generates requests that fit it (positive) and that break it
(negative: wrong types, missing fields, out-of-range values), sent over real HTTP to a running
server (FakeEngine). Every answer must be a non-5xx; every error must have OpenAI's shape.

    DFLASH_API_FUZZ_CASES=3000 python3 -m pytest tests/test_api_fuzz.py -q -s   # docs/reliability.md's figure
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from tests.fake_engine import FakeEngine, FakeReply, fake_studio
from tests.test_api import launch

CASES = int(os.environ.get("DFLASH_API_FUZZ_CASES", "300"))
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    engine = FakeEngine(default_reply=FakeReply("def f():\n    return 1\n"))
    studio = fake_studio(engine, db_path=tmp_path_factory.mktemp("fuzz") / "sessions.db")
    url = launch(studio)
    yield studio, url
    studio.close()


def check_answer(response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    content_type = (response.headers.get("content-type") or [""])[0]  # schemathesis keeps header lists
    if response.status_code >= 400:
        error = response.json().get("error")
        assert isinstance(error, dict), (response.status_code, response.text[:500], response.request.url,
                                         response.request.headers, (response.request.body or b"")[:300])
        assert set(error) == {"message", "type", "param", "code"} and error["message"], response.text
    elif content_type.startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        for event in events[:-1]:
            assert "error" not in json.loads(event), event
    else:
        assert content_type.startswith("application/json") and "error" not in response.json()


def test_fuzzed_requests_never_get_a_server_error(served):
    studio, url = served
    schema = schemathesis.openapi.from_url(url + "/v1/openapi.json")
    strategy = st.one_of(schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE))
    statuses: Counter = Counter()

    @given(case=strategy)
    @settings(max_examples=CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def fuzz(case):
        response = case.call(base_url=url + "/v1", timeout=60)
        statuses[response.status_code] += 1
        check_answer(response)

    fuzz()
    print(f"\nAPI fuzz: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
    assert sum(statuses.values()) >= CASES * 0.9
    assert statuses[200] > 0 and statuses[400] > 0  # both kinds really were generated
