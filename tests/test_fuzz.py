"""Property-based fuzzing of every API the app serves, on a real server (127.0.0.1, FakeEngine):

- every named Gradio endpoint through ``gradio_client`` with random and hostile values (NaN,
  ±inf, 1e308, huge and negative numbers, wrong types, nulls, control characters, markup, huge
  strings, random files);
- the OpenAI-compatible ``/v1`` routes with random and hostile JSON bodies and raw bytes.

The properties: no unhandled server error (every refusal is a named ``gr.Error`` / an API error
with a message), no HTTP 5xx, no hang, and the server still answers afterwards. Hypothesis tries
up to ``DFLASH_FUZZ_EXAMPLES`` cases per endpoint (default 8; ``scripts/reliability.sh`` runs
more); the figures count the cases that really reached the server, per endpoint: an endpoint
without arguments has one case to try, and a value the client cannot encode (NaN, ±inf in JSON)
never leaves the client, so it is counted apart, not as a server answer.
"""

from __future__ import annotations

import json
import os
import socket
from collections import Counter

import httpx
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from hypothesis import HealthCheck, given, settings  # noqa: E402  (a test dependency: missing, the run fails)
from hypothesis import strategies as st  # noqa: E402

import gradio.queueing  # noqa: E402
import gradio.utils  # noqa: E402
from gradio.exceptions import ComponentProcessingError  # noqa: E402
from gradio.exceptions import Error as GradioError  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402

from tests.fake_engine import FakeEngine, fake_studio  # noqa: E402
from tests.figures import record_figure  # noqa: E402

EXAMPLES = int(os.environ.get("DFLASH_FUZZ_EXAMPLES", "8"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("DFLASH_FUZZ_RANDOM") != "1",
                suppress_health_check=list(HealthCheck), database=None)

HOSTILE_TEXT = [
    "", " ", "\n\t\r", "\x00", "\x00" * 50, "\ud7ff\ue000\uffff", "🤖👩‍👩‍👧歪", "\u202e\u2066evil", "%s%n%x",
    "<script>window.__xss=1</script>", "<img src=x onerror=alert(1)>", "![x](http://example.invalid/a.png)",
    "' OR 1=1; DROP TABLE sessions; --", "../../../../etc/passwd", "{{7*7}}${7*7}", "NaN", "Infinity", "-1",
    "\\u0000", "a" * 70_000, "```python\n" + "x = (" * 5000, "\r\n" * 10_000,
]
HOSTILE_NUMBERS = [float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 2**63, -(2**63), 10**40, -1, 0, 0.5,
                   1e-320, 3, 65, 32769]

texts = st.one_of(st.text(max_size=300), st.sampled_from(HOSTILE_TEXT))
numbers = st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(-(10**30), 10**30), st.none(), st.text(max_size=6), st.booleans())
flags = st.one_of(st.booleans(), st.none(), st.integers(-3, 3), st.text(max_size=4), st.floats())
choices = st.one_of(st.none(), st.integers(-5, 10**12), st.text(max_size=40), st.floats(), st.sampled_from(HOSTILE_TEXT[:12]))
anything = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30)),
                        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner,
                                                                                               max_size=4)),
                        max_leaves=12)
SETTINGS = [numbers, numbers, numbers, numbers, flags, flags]  # block size, temperature, top-p, max new, 2 toggles

ENDPOINTS = {
    "/settings": SETTINGS,
    "/send": [texts],
    "/complete": [texts],
    "/respond": [],
    "/stop": [],
    "/regenerate": [],
    "/select_session": [choices, texts],
    "/new_session": [],
    "/search_sessions": [texts],
    "/rename_session": [texts, texts],
    "/delete_session": [],
    "/export_session": [],
    "/load_session": [anything],
    "/pick_model": [choices],
    "/teach_session": [choices],
    "/teach_reply": [choices],
    "/teach_step": [choices, numbers],
    "/compare": [choices],
    "/stop_compare": [choices],
    "/export_analytics": [choices],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app with the server's error payloads recorded: anything but a ``gr.Error`` is a crash."""
    unexpected: list[str] = []  # the crash of the case under way (cleared after each case)
    crashes = Counter()  # every crash of the run, for the figures
    original = gradio.utils.error_payload

    def recording(error, show_error):
        # Gradio's own refusal of a value its component cannot take (a slider given None) names
        # the component; anything else that is not a gr.Error is a crash.
        if isinstance(error, ComponentProcessingError) and "Could not preprocess input component" in str(error):
            return original(error, show_error)
        if error is not None and not isinstance(error, GradioError):
            unexpected.append(f"{type(error).__name__}: {str(error)[:200]}")
            crashes["server_errors"] += 1
        return original(error, show_error)

    gradio.utils.error_payload = recording
    gradio.queueing.error_payload = recording
    studio = fake_studio(FakeEngine(), db_path=tmp_path_factory.mktemp("fuzz") / "sessions.db")
    studio.host.start().result(timeout=10)
    studio.demo.launch(**studio.launch_kwargs(server_port=free_port(), prevent_thread_lock=True, quiet=True,
                                              inbrowser=False))
    yield studio, studio.demo.local_url.rstrip("/"), unexpected, crashes
    studio.close()
    gradio.utils.error_payload = original
    gradio.queueing.error_payload = original


@pytest.fixture(scope="module")
def client(server):
    return Client(server[1] + "/", verbose=False)


@pytest.fixture(scope="module")
def tally():
    """(endpoint, outcome) -> cases, outcome one of 'answered', 'refused' (the server's named
    error), 'not sent' (the client could not encode the values)."""
    return Counter()


def call(client, api_name, args) -> str:
    """Run one call and say how it ended; a refusal (gr.Error) must carry a message, anything
    else is a crash."""
    try:
        job = client.submit(*args, api_name=api_name)
        job.result(timeout=60)
    except Exception as exc:  # noqa: BLE001 - classified below
        message = str(exc)
        assert "Traceback" not in message, message
        if type(exc).__name__ == "AppError":
            assert message.strip() and message.strip() != "None", f"{api_name}: an error without a message"
            return "refused"
        # httpx encodes JSON with allow_nan=False: NaN and ±inf stop in the client, unsent
        assert isinstance(exc, ValueError) and "JSON compliant" in message, f"{api_name}: {type(exc).__name__}: {exc}"
        return "not sent"
    return "answered"


def check_no_crash(server, api_name, args):
    unexpected = server[2]
    if unexpected:
        crash = unexpected[-1]
        unexpected.clear()  # one report per failing case; the next test starts clean
        raise AssertionError(f"{api_name}{tuple(_short(a) for a in args)} -> server error {crash}")


def _short(value):
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."


@pytest.mark.parametrize("api_name", sorted(ENDPOINTS))
def test_every_gradio_endpoint_survives_hostile_values(server, client, tally, api_name):
    strategies = ENDPOINTS[api_name]

    @FUZZ
    @given(st.tuples(*strategies) if strategies else st.just(()))
    def fuzz(args):
        tally[api_name, call(client, api_name, list(args))] += 1
        check_no_crash(server, api_name, args)

    fuzz()
    assert httpx.get(server[1] + "/config", timeout=10).status_code == 200  # still serving


def test_import_survives_hostile_files(server, client, tally, tmp_path):
    counter = [0]

    @FUZZ
    @given(st.one_of(st.binary(max_size=2000), anything.map(lambda v: json.dumps(v).encode()),
                     st.sampled_from([b"", b"{}", b'{"format":"dflash-studio-sessions","version":99,"sessions":[]}',
                                      b'{"sessions":[{"uuid":null}]}', b"\xff\xfe\x00", b"[" * 10_000])))
    def fuzz(content):
        counter[0] += 1
        path = tmp_path / f"import-{counter[0]}.json"
        path.write_bytes(content)
        tally["/import_sessions", call(client, "/import_sessions", [handle_file(str(path))])] += 1
        check_no_crash(server, "/import_sessions", [content[:60]])

    fuzz()


# ----------------------------------------------------------------------------- the HTTP API
messages = st.one_of(
    st.lists(st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "assistant", "system", "tool"]),
                                                      st.text(max_size=8), st.none()),
                                    "content": st.one_of(texts, st.none(), st.integers(), anything)}),
             max_size=4),
    anything,
)
bodies = st.fixed_dictionaries({}, optional={
    "model": st.one_of(st.text(max_size=40), st.none(), st.integers()), "messages": messages,
    "prompt": st.one_of(texts, st.lists(st.integers(-5, 10**6), max_size=8), anything),
    "max_tokens": numbers, "max_completion_tokens": numbers, "temperature": numbers, "top_p": numbers,
    "stream": flags, "stop": st.one_of(texts, st.lists(texts, max_size=5), anything), "n": numbers,
    "seed": numbers, "logprobs": flags, "stream_options": anything, "dflash": anything,
    "trust_remote_code": st.just(True), "tools": anything, "response_format": anything,
})


def api_ok(response: httpx.Response, what) -> str:
    assert response.status_code < 500, f"{what}: HTTP {response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        error = response.json().get("error") or {}
        assert isinstance(error, dict) and str(error.get("message", "")).strip(), f"{what}: {response.text[:300]}"
        return "refused"
    return "answered"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_the_http_api_survives_hostile_bodies(server, tally, route):
    base = server[1]

    @FUZZ
    @given(bodies)
    def fuzz(body):
        text = json.dumps(body, allow_nan=True)
        with httpx.Client(timeout=60) as http:
            response = http.post(base + route, content=text, headers={"content-type": "application/json"})
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                assert response.status_code == 200
                tally[route, "answered"] += 1
                return
            tally[route, api_ok(response, (route, _short(body)))] += 1

    fuzz()
    assert httpx.get(base + "/v1/models", timeout=10).status_code == 200


def test_the_http_api_survives_raw_garbage(server, tally):
    base = server[1]

    @FUZZ
    @given(st.binary(max_size=3000), st.sampled_from(["application/json", "text/plain", "multipart/form-data", ""]),
           st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/nope", "/v1/models/x"]))
    def fuzz(raw, content_type, route):
        with httpx.Client(timeout=60) as http:
            response = http.post(base + route, content=raw, headers={"content-type": content_type})
        tally["raw bytes to /v1", api_ok(response, (route, raw[:40]))] += 1

    fuzz()


def fuzz_figures(tally: Counter, server_errors: int) -> dict:
    """The fuzz figures, counted: cases that reached the server (all endpoints together and the
    fewest of any one), cases the client could not send, server errors."""
    sent: Counter = Counter()
    for (endpoint, outcome), cases in tally.items():
        sent[endpoint] += cases if outcome != "not sent" else 0
    endpoints = {endpoint for endpoint, _ in tally}
    return {"cases": sum(sent.values()), "endpoints": len(endpoints),
            "fewest_per_endpoint": min((sent[e] for e in endpoints), default=0),
            "not_sent": sum(c for (_, outcome), c in tally.items() if outcome == "not sent"),
            "server_errors": server_errors}


def test_fuzz_figures_count_what_reached_the_server():
    tally = Counter({("/send", "answered"): 3, ("/send", "not sent"): 2, ("/stop", "refused"): 1})
    assert fuzz_figures(tally, 0) == {"cases": 4, "endpoints": 2, "fewest_per_endpoint": 1, "not_sent": 2,
                                      "server_errors": 0}


def test_every_fuzzed_endpoint_got_cases_to_the_server(server, tally):
    """Runs after the fuzz tests above (file order) and records their counted figures."""
    if not tally:
        pytest.skip("the fuzz tests did not run in this pytest run (-k chose this test alone)")
    figures = fuzz_figures(tally, server[3]["server_errors"])
    record_figure("fuzz", per_endpoint_limit=EXAMPLES, **figures)
    unsent = sorted({e for e, _ in tally} - {e for (e, outcome) in tally if outcome != "not sent"})
    assert not unsent, f"no case reached the server for {unsent}"
    assert figures["server_errors"] == 0
