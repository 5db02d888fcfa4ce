"""The network guard (app.netguard) on real servers on 127.0.0.1 with a FakeEngine:

- a server with --auth refuses every route without a login (pages, Gradio API, file routes, /v1),
  and no response without a login carries any session text;
- Host names other than this server's (DNS rebinding) and cross-site Origins are refused;
- the file route serves nothing outside the app's own files (a traversal corpus);
- uploads and request bodies are capped, the queue is bounded, SSR is off, and the server listens
  on 127.0.0.1 only even when GRADIO_SERVER_NAME says otherwise.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app.config import AppConfig  # noqa: E402
from app.netguard import (GuardConfig, allowed_names, host_allowed, login_exempt,  # noqa: E402
                          origin_allowed)
from app.wiring import guard_config  # noqa: E402
from tests.fake_engine import FakeEngine, fake_studio  # noqa: E402
from tests.figures import record_figure  # noqa: E402

SECRET = "SECRET-zq9-7c1"  # in a session title and message: must never appear in a refused response
AUTH = ("me", "s3cret-pass")
V1_ROUTES = ["/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/sessions"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_process(process) -> None:
    """Terminate a server a test started (by its own handle), killing it when it does not stop."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def serve(tmp_path: Path, **config):
    studio = fake_studio(FakeEngine(delay_s=0.01), db_path=tmp_path / "sessions.db", **config)
    session = studio.store.create_session(title=f"{SECRET} title")
    studio.store.add_message(session, "user", f"{SECRET} message body")
    studio.host.start().result(timeout=10)
    studio.demo.launch(**studio.launch_kwargs(server_port=free_port(), prevent_thread_lock=True, quiet=True,
                                              inbrowser=False))
    return studio


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    studio = serve(tmp_path_factory.mktemp("auth"), auth=AUTH)
    yield studio, studio.demo.local_url.rstrip("/")
    studio.close()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    studio = serve(tmp_path_factory.mktemp("open"))
    yield studio, studio.demo.local_url.rstrip("/")
    studio.close()


def route_paths(app) -> list[str]:
    """Every route of the running app with its path parameters filled in."""
    paths: set[str] = set()

    def walk(routes, prefix=""):
        for route in routes:
            if hasattr(route, "path"):
                paths.add(prefix + route.path)
            sub = getattr(route, "router", None) or getattr(route, "original_router", None)
            if sub is not None and sub is not route:
                walk(getattr(sub, "routes", []), prefix + getattr(route, "prefix", ""))

    walk(app.routes)
    filled = []
    for path in sorted(paths):
        for name, value in (("{path_or_url:path}", "/etc/passwd"), ("{path:path}", "index.html"),
                            ("{file_path:path}", "x"), ("{url_path:path}", "http://127.0.0.1/"),
                            ("{segment_id}.{ext}", "0.ts")):
            path = path.replace(name, value)
        while "{" in path:
            start = path.index("{")
            path = path[:start] + "1" + path[path.index("}", start) + 1:]
        filled.append(path)
    return filled + V1_ROUTES


# ----------------------------------------------------------------------------- pure rules
@pytest.mark.parametrize("bind, host, ok", [
    ("127.0.0.1", "127.0.0.1:7860", True), ("127.0.0.1", "localhost:7860", True), ("127.0.0.1", "[::1]:7860", True),
    ("127.0.0.1", "LOCALHOST", True), ("127.0.0.1", "evil.example:7860", False), ("127.0.0.1", "", False),
    ("127.0.0.1", "192.168.1.5:7860", False), ("127.0.0.1", "localhost.evil.example", False),
    ("127.0.0.1", "127.0.0.1.nip.io", False), ("0.0.0.0", "192.168.1.5:7860", True),
    ("0.0.0.0", "evil.example", False), ("0.0.0.0", "[fe80::1]:7860", True), ("192.168.1.5", "192.168.1.5", True),
    ("192.168.1.5", "10.0.0.9", False),
])
def test_host_names_the_server_answers_to(bind, host, ok):
    config = GuardConfig(bind_host=bind)
    assert host_allowed(host, config, allowed_names(config)) is ok


def test_allowed_host_names_are_configurable_and_validated():
    config = guard_config(AppConfig(host="0.0.0.0", auth=AUTH, allowed_hosts=("studio.lan",)))
    assert host_allowed("studio.lan:8080", config, allowed_names(config)) and config.login_required
    with pytest.raises(Exception, match="allowed-host"):
        AppConfig(allowed_hosts=("http://x",)).validate()


@pytest.mark.parametrize("origin, ok", [
    ("http://127.0.0.1:7860", True), ("http://localhost:7860", True), ("null", False), ("NULL", False),
    ("https://evil.example", False), ("http://127.0.0.1.evil.example:7860", False), ("file://", False),
    ("chrome-extension://abc", False), ("", False), ("http://evil.example@127.0.0.1:7860", False),
])
def test_origins_that_count_as_this_site(origin, ok):
    config = GuardConfig()
    assert origin_allowed(origin, "127.0.0.1:7860", allowed_names(config)) is ok


def test_the_login_gate_exempts_only_the_login_page_and_self_authenticating_routes():
    config = GuardConfig(login_required=True)
    exempt = lambda method, path: login_exempt({"method": method, "path": path}, config)  # noqa: E731
    assert exempt("GET", "/") and exempt("POST", "/login") and exempt("GET", "/assets/index.js")
    assert exempt("POST", "/v1/chat/completions")  # the API checks its own key
    for method, path in [("POST", "/gradio_api/queue/join"), ("GET", "/gradio_api/file=/etc/passwd"),
                         ("POST", "/gradio_api/upload"), ("GET", "/gradio_api/info"), ("POST", "/"),
                         ("GET", "/gradio_api/heartbeat/x"), ("POST", "/gradio_api/cancel")]:
        assert not exempt(method, path), (method, path)


# ----------------------------------------------------------------------------- a server with --auth
def test_every_route_refuses_a_request_without_login(auth_server):
    studio, base = auth_server
    paths = route_paths(studio.demo.app)
    assert len(paths) > 40 and "/gradio_api/queue/join" in paths
    checked, leaked, wrong = 0, [], []  # leaked: the secret in a body; wrong: a status other than a refusal
    with httpx.Client(timeout=10) as http:
        for path in paths:
            for method in ("GET", "POST"):
                response = http.request(method, base + path)
                checked += 1
                if SECRET in response.text:
                    leaked.append((method, path))
                exempt = login_exempt({"method": method, "path": path}, guard_config(studio.config))
                refusals = (401, 403, 404, 405) if path.startswith("/v1/") else (401,)
                if response.status_code >= 500 or not exempt and response.status_code not in refusals:
                    wrong.append((method, path, response.status_code))
    record_figure("routes_without_login", requests=checked, leaked=len(leaked), not_refused=len(wrong))
    assert not leaked and not wrong, (leaked[:5], wrong[:5])
    assert checked >= 80


def test_a_login_opens_the_app_and_the_api(auth_server):
    from gradio_client import Client

    studio, base = auth_server
    with httpx.Client(timeout=10) as http:
        assert http.post(base + "/login", data={"username": "me", "password": "wrong"}).status_code == 400
        assert http.get(base + "/config").status_code == 401
        assert http.post(base + "/login", data={"username": AUTH[0], "password": AUTH[1]}).status_code == 200
        assert http.get(base + "/config").status_code == 200
        assert http.get(base + "/gradio_api/info").status_code == 200
    client = Client(base + "/", auth=AUTH, verbose=False)
    assert client.view_api(print_info=False, return_format="dict")["named_endpoints"]


# ----------------------------------------------------------------------------- DNS rebinding, cross-site
def test_a_foreign_host_name_is_refused_on_every_route(open_server):
    studio, base = open_server
    with httpx.Client(timeout=10) as http:
        for path in route_paths(studio.demo.app):
            for method in ("GET", "POST"):
                response = http.request(method, base + path, headers={"Host": "evil.example"})
                assert response.status_code == 421, (method, path, response.status_code)
                assert SECRET not in response.text
        refused = http.get(base + "/", headers={"Host": "evil.example:7860"})
        assert "DNS-rebinding" in refused.json()["detail"]
        assert http.get(base + "/", headers={"Host": "localhost"}).status_code == 200


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://localhost.evil.example"])
@pytest.mark.parametrize("path", ["/gradio_api/queue/join", "/gradio_api/upload", "/gradio_api/run/send",
                                  "/gradio_api/call/send", "/login"])
def test_a_cross_site_request_is_refused(open_server, origin, path):
    _, base = open_server
    with httpx.Client(timeout=10) as http:
        response = http.post(base + path, headers={"Origin": origin}, json={"data": ["x"]})
    assert response.status_code == 403 and "cross-site" in response.json()["detail"]
    assert "access-control-allow-origin" not in response.headers


def test_same_site_requests_pass_and_fetch_metadata_is_checked(open_server):
    _, base = open_server
    with httpx.Client(timeout=10) as http:
        assert http.get(base + "/config", headers={"Origin": base}).status_code == 200
        blind = http.post(base + "/gradio_api/upload", headers={"Sec-Fetch-Site": "cross-site"})
        assert blind.status_code == 403
        assert http.get(base + "/config", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200


# ----------------------------------------------------------------------------- files, caps, binding
TRAVERSALS = [
    "{db}", "{secret}", "/etc/passwd", "../../../../etc/passwd", "..%2f..%2f..%2fetc%2fpasswd",
    "%2e%2e/%2e%2e/%2e%2e/etc/passwd", "%252e%252e%252fetc%252fpasswd", "....//....//etc/passwd",
    "..\\..\\..\\etc\\passwd", "/etc/./passwd", "//etc/passwd", "/proc/self/environ", "/proc/self/cmdline",
    "file:///etc/passwd", "C:\\Windows\\win.ini", "\\\\server\\share\\x", "/etc/passwd%00.png",
    "{db}-wal", "{tmp}/../{secret_name}", "{secret_upper}", "~/.bashrc", "%2Fetc%2Fpasswd",
    "{app}/../../etc/passwd", "{app}/app/config.py", "{app}/.git/config", "/root/.cache/huggingface/token",
    "http://127.0.0.1:1/", "https://example.invalid/x", "{symlink}",
]


def test_file_routes_serve_nothing_outside_the_apps_files(auth_server, tmp_path):
    studio, base = auth_server
    secret = tmp_path / "secret.txt"
    secret.write_text(f"{SECRET} on disk")
    link = Path(studio.demo.GRADIO_CACHE if hasattr(studio.demo, "GRADIO_CACHE") else tmp_path) / "link.txt"
    try:
        link.symlink_to(secret)
    except OSError:
        link = secret
    values = dict(db=studio.store.path, secret=secret, tmp=tmp_path, secret_name=secret.name,
                  secret_upper=str(secret).upper(), app=Path(__file__).resolve().parents[1], symlink=link)
    corpus = [t.format(**values) for t in TRAVERSALS]
    requests, served = 0, []  # served: a request answered with anything but a refusal, or with a file's bytes
    with httpx.Client(timeout=10) as http:
        http.post(base + "/login", data={"username": AUTH[0], "password": AUTH[1]})
        for target in corpus:
            for route in ("/gradio_api/file=", "/file=", "/gradio_api/file/", "/static/", "/assets/"):
                response = http.get(base + route + target)
                requests += 1
                body = response.content
                if (response.status_code not in (400, 403, 404, 405, 422) or SECRET.encode() in body
                        or b"SQLite format 3" in body or b"root:" in body):
                    served.append((route, target, response.status_code))
    record_figure("traversal", requests=requests, variants=len(corpus), served_outside=len(served))
    assert not served, served[:5]
    assert requests >= 140


def test_uploads_and_bodies_are_capped_and_the_queue_is_bounded(open_server):
    studio, base = open_server
    assert studio.demo.max_file_size == 32 * 1024 * 1024
    assert studio.demo._queue.max_size == 64
    with httpx.Client(timeout=30) as http:
        small = http.post(base + "/gradio_api/upload", files={"files": ("a.json", b"{}", "application/json")})
        assert small.status_code == 200
        big = http.post(base + "/gradio_api/upload", files={"files": ("a.json", b"x" * (34 * 1024 * 1024))})
        assert big.status_code == 413
        huge_json = http.post(base + "/gradio_api/queue/join", content=b"x" * (9 * 1024 * 1024),
                              headers={"content-type": "application/json"})
        assert huge_json.status_code == 413 and "over 8 MB" in huge_json.json()["detail"]

        def chunks():
            for _ in range(10):
                yield b"y" * (1024 * 1024)

        chunked = http.post(base + "/gradio_api/queue/join", content=chunks(),
                            headers={"content-type": "application/json"})
        assert chunked.status_code in (400, 413)  # cut at 8 MB either way (Gradio turns the cut into 400)


def listening_ports(pid: int) -> set[tuple[str, int]]:
    """(address, port) of TCP sockets this process listens on, from /proc (no psutil needed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, family in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                if family == 4:
                    address = socket.inet_ntoa(bytes.fromhex(address)[::-1])
                found.add((address, int(port, 16)))
    return found


def test_loopback_only_ssr_off_even_when_the_environment_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SSR_MODE", "True")
    monkeypatch.setenv("GRADIO_SHARE", "True")
    before = listening_ports(os.getpid())
    studio = serve(tmp_path)
    try:
        port = studio.demo.server_port
        assert studio.demo.local_url == f"http://127.0.0.1:{port}/" and studio.demo.share_url is None
        assert studio.demo.ssr_mode is False
        assert listening_ports(os.getpid()) - before == {("127.0.0.1", port)}
    finally:
        studio.close()


def test_the_login_cookie_is_read_as_gradio_reads_it():
    """Cookies and headers come through Starlette's parsers (Gradio's own login check reads them
    the same way): a token among other cookies, with the spacing and quoting browsers send, logs in."""
    from types import SimpleNamespace

    from app.netguard import logged_in, refusal

    app = SimpleNamespace(tokens={"tok-1": "me"}, cookie_id="abc")

    def scope(cookie: str, **extra) -> dict:
        headers = [(b"host", b"127.0.0.1:7860"), (b"cookie", cookie.encode())]  # ASGI: lower-case names
        return {"type": "http", "method": "GET", "path": "/gradio_api/info", "app": app, "headers": headers, **extra}

    assert logged_in(scope('theme=dark;access-token-abc=tok-1 ; other="a b"'))
    assert logged_in(scope("access-token-unsecure-abc=tok-1"))
    assert not logged_in(scope("access-token-abc=tok-2; access-token-xyz=tok-1"))  # unknown token, another app's cookie
    assert not logged_in(scope("access-token-abc"))
    config = GuardConfig(login_required=True)
    assert refusal(scope("access-token-abc=tok-1"), config, allowed_names(config)) is None
    assert refusal(scope("nothing=1"), config, allowed_names(config))[0] == 401
