"""Image urls cannot reach loopback, private or link-local addresses unless allowed (server-side request forgery).

No test here sends traffic anywhere but loopback, even when the guard under test is broken: every socket
connect the test's code makes goes through `connect_guard`, which refuses (and records) any non-loopback address, and host
names other than `localhost` resolve only through a stubbed resolver. The images are served by a tiny
http.server on 127.0.0.1 run by the test itself.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

from edje.serving.image_fetch import ImageInputError, address_kind, client_for, fetch_image, fetch_images, parse_allow

BODY = b"\x89PNG\r\n\x1a\n not decoded by the fetcher"
STREAM_TOTAL = 256 * 1024 * 1024  # far more than the kernel's socket buffers hold
LOOPBACK_ONLY = ("127.0.0.1/32",)


# ------------------------------------------------------------------------------------------ fixtures
class _Handler(BaseHTTPRequestHandler):
    """/img: the body; /redirect?to=URL: 302 there; /stream: an endless body; /declared: a huge Content-Length;
    /barrier: answers once 4 requests are in flight; /slow: answers after 3 s."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        server.paths.append(self.path)
        server.hosts.append(self.headers.get("Host"))
        parts = urlsplit(self.path)
        route = getattr(self, "_" + parts.path.strip("/"), None)
        if route is None:
            self.send_error(404)
            return
        route(parse_qs(parts.query))

    def _ok(self, body: bytes = BODY):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _img(self, query):
        self._ok()

    def _redirect(self, query):
        self.send_response(302)
        self.send_header("Location", query["to"][0])
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _stream(self, query):
        # No Content-Length: the body ends when the connection closes; only the reader's cap can stop it.
        self.send_response(200)
        self.end_headers()
        chunk, sent = b"x" * 65536, 0
        try:
            while sent < STREAM_TOTAL:
                self.wfile.write(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.server.streamed.append(sent)

    def _declared(self, query):
        self.send_response(200)
        self.send_header("Content-Length", str(STREAM_TOTAL))
        self.end_headers()
        self.wfile.write(b"x" * 1024)

    def _barrier(self, query):
        try:
            self.server.barrier.wait()
        except threading.BrokenBarrierError:
            self.send_error(500, "requests did not arrive together")
            return
        self._ok(query["n"][0].encode())

    def _slow(self, query):
        self.server.release.wait(3)
        self._ok()


@pytest.fixture
def images():
    """A loopback image server: (server, base url); server.paths lists the paths it was asked for."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.paths, server.hosts, server.streamed = [], [], []
    server.barrier, server.release = threading.Barrier(4, timeout=10), threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.release.set()
    server.shutdown()
    server.server_close()


def _is_loopback(address) -> bool:
    try:
        ip = ipaddress.ip_address(address[0].split("%")[0])
    except (TypeError, ValueError, IndexError):
        return False
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


@pytest.fixture(autouse=True)
def connect_guard(monkeypatch):
    """Every socket connect the code under test makes: loopback ones go through; any other is refused, recorded,
    and fails the test (unless the test lists it in `expected`, for a connection the policy should allow).

    The patch is process-wide, so threads left running by earlier tests in the same process (Ray Data's usage
    poller queries Prometheus on localhost:9090 every 10 s) connect through it too: those threads were alive
    before this test began, so they are not the code under test; their connects go straight through and are
    kept apart in `background`. The test's own thread and every thread started during the test (an event loop
    a TestClient runs, an executor's) are checked and recorded."""
    guard = SimpleNamespace(attempts=[], blocked=[], expected=[], background=[])
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    # Thread objects, not idents: an ident may be reused by a thread started later, one of the test's own.
    before = set(threading.enumerate()) - {threading.current_thread()}

    def check(address):
        if threading.current_thread() in before:
            guard.background.append(address)
            return
        guard.attempts.append(address)
        if not _is_loopback(address):
            guard.blocked.append(address[:2] if isinstance(address, tuple) else address)
            raise ConnectionRefusedError(f"test guard: no connection to {address} leaves this machine")

    def connect(self, address):
        check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield guard
    assert guard.blocked == guard.expected, f"connections attempted beyond loopback: {guard.blocked}"


@pytest.fixture
def resolver(monkeypatch):
    """Stubbed DNS: `resolver.names[host]` is a list of addresses, or a list of such lists (one per lookup)."""
    real = socket.getaddrinfo
    stub = SimpleNamespace(names={}, calls=[], background=[])
    # Threads that were running before this test (left by earlier tests in the same process, e.g. a Ray client's)
    # are not the code under test: their lookups go to the real resolver and are kept apart.
    before = {t.ident for t in threading.enumerate()} - {threading.get_ident()}

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        try:
            ipaddress.ip_address(host)
            return real(host, port, family, type, proto, flags)  # a literal: no lookup happens
        except ValueError:
            pass
        if threading.get_ident() in before:
            stub.background.append((threading.current_thread().name, host))
            return real(host, port, family, type, proto, flags)
        stub.calls.append(host)
        answers = stub.names.get(host)
        if answers is None:
            raise socket.gaierror(socket.EAI_NONAME, f"stub resolver: unknown host {host}")
        if answers and isinstance(answers[0], list):  # one answer per lookup, the last one repeated
            answers = answers[min(stub.calls.count(host), len(answers)) - 1]
        out = []
        for a in answers:
            ip = ipaddress.ip_address(a)
            fam = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            addr = (a, port or 0, 0, 0) if ip.version == 6 else (a, port or 0)
            out.append((fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", addr))
        return out

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return stub


def _fetch(url, allow=None, max_bytes=100_000, timeout_s=5.0, hosts=None) -> bytes:
    return asyncio.run(fetch_image(url, max_bytes, timeout_s, hosts, allow))


def _refused(url, allow=None, **kw) -> ImageInputError:
    with pytest.raises(ImageInputError) as info:
        _fetch(url, allow, **kw)
    return info.value


# ------------------------------------------------------------------------------------------ the guard
@pytest.fixture(scope="module")
def background_connector():
    """A thread started before any test's connect_guard (module scope), standing in for one an earlier test left
    running: `connect()` has it open a connection to a loopback listener of its own, and returns that address."""
    import queue

    listener = socket.create_server(("127.0.0.1", 0))
    jobs: queue.Queue = queue.Queue()

    def serve():
        while (done := jobs.get()) is not None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(listener.getsockname())
            done.set()

    thread = threading.Thread(target=serve, name="left-by-an-earlier-test", daemon=True)
    thread.start()

    def connect():
        done = threading.Event()
        jobs.put(done)
        assert done.wait(10), "the background thread did not connect"
        return listener.getsockname()

    yield SimpleNamespace(connect=connect)
    jobs.put(None)
    thread.join(10)
    listener.close()


def test_the_guard_records_the_code_under_tests_connects_not_a_background_threads(
        images, connect_guard, background_connector):
    server, base = images
    own = ("127.0.0.1", server.server_address[1])
    background = background_connector.connect()  # during the test, from a thread that predates it
    assert _fetch(base + "/img", LOOPBACK_ONLY) == BODY  # connects from the test's thread
    fetched = []  # and from a thread started during the test (as a TestClient's event loop is): counted too
    worker = threading.Thread(target=lambda: fetched.append(_fetch(base + "/img", LOOPBACK_ONLY)))
    worker.start()
    worker.join(20)
    assert fetched == [BODY] and server.paths == ["/img", "/img"]
    assert connect_guard.attempts == [own, own], connect_guard.attempts
    assert background in connect_guard.background  # with any other thread's left running by earlier tests


# ------------------------------------------------------------------------------------- loopback urls
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_urls_are_refused_by_default_before_any_connection(images, connect_guard, host):
    server, base = images
    url = base.replace("127.0.0.1", host) + "/img"
    e = _refused(url)
    assert e.status == 422 and "not fetched by this server" in e.detail and "loopback" in e.detail, e.detail
    assert "image_url_allow" in e.detail
    assert connect_guard.attempts == [] and server.paths == []


@pytest.mark.parametrize("host, allow", [("127.0.0.1", LOOPBACK_ONLY), ("127.0.0.1", ("loopback",)),
                                         ("localhost", ("loopback",)), ("localhost", ("localhost",))])
def test_loopback_urls_are_fetched_with_the_allow_option(images, host, allow):
    server, base = images
    assert _fetch(base.replace("127.0.0.1", host) + "/img", allow) == BODY
    assert server.paths == ["/img"] and server.hosts == [f"{host}:{server.server_address[1]}"]  # Host is the url's


def _self_signed(tmp_path, name: str):
    """(cert, key) PEM files of a self-signed certificate for `name`."""
    import datetime

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False).sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return tmp_path / "cert.pem", tmp_path / "key.pem"


def test_https_connects_to_the_checked_address_with_the_host_name_as_sni(tmp_path, connect_guard):
    """The connection goes to an address, the TLS handshake still names the url's host (then fails: self-signed)."""
    import ssl

    cert, key = _self_signed(tmp_path, "localhost")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    names = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        e = _refused(f"https://localhost:{server.server_address[1]}/img", allow=("loopback",))
    finally:
        server.shutdown()
        server.server_close()
    assert e.status == 422 and "certificate" in e.detail.lower(), e.detail
    assert names == ["localhost"]
    assert connect_guard.attempts and all(_is_loopback(a) for a in connect_guard.attempts)


def test_allow_entries_are_checked():
    assert parse_allow(("loopback", "10.0.0.0/8", "Images.Internal.")).hosts == frozenset({"images.internal"})
    for bad in ("10.0.0.0/33", "fd00::/200", ""):
        with pytest.raises(ValueError, match="image_url_allow"):
            parse_allow((bad,))


def test_the_serve_flag_and_the_config_carry_the_allow_option(tmp_path):
    import yaml

    from edje.jobs.serve import config_from_args, parse
    from edje.serving.config import ServeConfig

    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"args": {"checkpoint": "c", "token_tables": ["a.parquet"]}}))
    cfg = config_from_args(parse(["--config", str(path), "--image-url-allow", "loopback", "10.1.0.0/16"]))
    assert cfg.image_url_allow == ("loopback", "10.1.0.0/16")
    assert config_from_args(parse(["--config", str(path)])).image_url_allow is None
    assert ServeConfig(checkpoint="c", token_tables=("t",), image_url_allow="loopback").image_url_allow == ("loopback",)
    with pytest.raises(ValueError, match="image_url_allow"):
        ServeConfig(checkpoint="c", token_tables=("t",), image_url_allow=("10.0.0.0/33",))


# ------------------------------------------------------------------------------- non-public addresses
REFUSED_LITERALS = [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://10.0.0.1/x.png", "private"),
    ("http://192.168.1.1/x.png", "private"),
    ("http://172.16.0.1/x.png", "private"),
    ("http://[::1]/x.png", "loopback"),
    ("http://[fd00::1]/x.png", "private"),
    ("http://[fe80::1]/x.png", "link-local"),
    ("http://[::ffff:127.0.0.1]/x.png", "loopback"),
    ("http://[::ffff:169.254.169.254]/x.png", "link-local"),
    ("http://0.0.0.0/x.png", "unspecified"),
    ("http://224.0.0.1/x.png", "multicast"),
    ("https://10.0.0.1/x.png", "private"),
]


@pytest.mark.parametrize("url, kind", REFUSED_LITERALS)
def test_non_public_addresses_are_refused_before_any_connection(resolver, connect_guard, url, kind):
    e = _refused(url)
    assert e.status == 422 and kind in e.detail, e.detail
    assert connect_guard.attempts == [] and resolver.calls == []


@pytest.mark.parametrize("addresses, kind", [
    (["169.254.169.254"], "link-local"),
    (["10.0.0.1"], "private"),
    (["fd12:3456::1"], "private"),
    (["::1"], "loopback"),
    (["93.184.216.34", "192.168.1.1"], "private"),  # every address is checked, not only the first
])
def test_host_names_resolving_to_non_public_addresses_are_refused(resolver, connect_guard, addresses, kind):
    resolver.names["images.example.com"] = addresses
    e = _refused("http://images.example.com/x.png")
    assert e.status == 422 and kind in e.detail and "images.example.com" in e.detail, e.detail
    assert connect_guard.attempts == [] and resolver.calls == ["images.example.com"]


def test_an_allowed_network_admits_only_itself(resolver, connect_guard):
    resolver.names["cdn.internal"] = ["10.1.2.3"]
    e = _refused("http://cdn.internal/x.png", allow=("10.9.0.0/16",))
    assert "private" in e.detail and connect_guard.attempts == []
    # Allowed, the fetch goes on to connect to the checked address (the guard stops it leaving the machine).
    connect_guard.expected = [("10.1.2.3", 80)]
    e = _refused("http://cdn.internal/x.png", allow=("10.1.0.0/16",))
    assert e.status == 422 and "could not fetch" in e.detail, e.detail


def test_public_addresses_are_classified_as_public():
    for a in ("93.184.216.34", "8.8.8.8", "2606:4700::1111"):
        assert address_kind(ipaddress.ip_address(a)) is None
    for a in ("100.64.0.1", "2002:7f00:1::1", "198.18.0.1"):  # carrier NAT, 6to4 of loopback, benchmarking
        assert address_kind(ipaddress.ip_address(a)) is not None


def test_only_http_and_https_urls_are_fetched(connect_guard):
    for url in ("ftp://127.0.0.1/x.png", "file:///etc/passwd", "gopher://127.0.0.1:70/", "http:///x.png"):
        assert _refused(url, allow=("loopback",)).status == 422
    assert connect_guard.attempts == []


# ------------------------------------------------------------------------------ redirects, rebinding
@pytest.mark.parametrize("target, kind", [("http://169.254.169.254/latest/meta-data/", "link-local"),
                                          ("http://[::ffff:10.0.0.1]/", "private"),
                                          ("http://internal.example.com/x.png", "private")])
def test_a_redirect_to_a_refused_address_is_refused_at_the_hop(images, resolver, connect_guard, target, kind):
    server, base = images
    resolver.names["internal.example.com"] = ["10.0.0.7"]
    e = _refused(f"{base}/redirect?to={target}", allow=LOOPBACK_ONLY)
    assert e.status == 422 and kind in e.detail, e.detail
    assert server.paths == [f"/redirect?to={target}"]
    assert all(_is_loopback(a) for a in connect_guard.attempts)


def test_redirects_within_allowed_hosts_are_followed_and_limited(images):
    server, base = images
    assert _fetch(f"{base}/redirect?to=/img", LOOPBACK_ONLY) == BODY
    e = _refused(f"{base}/redirect?to=http://localhost/img", hosts=("127.0.0.1",), allow=LOOPBACK_ONLY)
    assert "host 'localhost' are not fetched" in e.detail, e.detail  # image_url_hosts still applies to every hop
    assert _fetch(base + _nested_redirects(5), LOOPBACK_ONLY) == BODY
    e = _refused(base + _nested_redirects(6), allow=LOOPBACK_ONLY)
    assert "more than 5 redirects" in e.detail, e.detail


def _nested_redirects(depth: int) -> str:
    """A path that redirects `depth` times before /img (each hop's target url-encoded in the next)."""
    from urllib.parse import quote

    path = "/img"
    for _ in range(depth):
        path = "/redirect?to=" + quote(path, safe="")
    return path


def test_dns_rebinding_cannot_reach_loopback(images, resolver, connect_guard):
    """A name that is public at the check and loopback a moment later: the connection goes to the checked address."""
    server, base = images
    port = server.server_address[1]
    resolver.names["rebind.example.com"] = [["93.184.216.34"], ["127.0.0.1"]]
    connect_guard.expected = [("93.184.216.34", port)]  # the checked public address; the guard keeps it local
    e = _refused(f"http://rebind.example.com:{port}/img")
    assert e.status == 422 and "could not fetch" in e.detail, e.detail
    assert resolver.calls == ["rebind.example.com"]  # one lookup: nothing resolves the name again to connect
    assert server.paths == []


# ----------------------------------------------------------------------------- size, time, concurrency
def test_the_byte_cap_aborts_a_streamed_body(images):
    server, base = images
    e = _refused(f"{base}/stream", allow=LOOPBACK_ONLY, max_bytes=100_000)
    assert e.status == 413 and "limit" in e.detail, e.detail
    deadline = time.time() + 20
    while not server.streamed and time.time() < deadline:
        time.sleep(0.05)
    assert server.streamed and server.streamed[0] < STREAM_TOTAL // 4, server.streamed  # the download stopped


def test_a_declared_length_over_the_cap_is_refused_unread(images):
    server, base = images
    e = _refused(f"{base}/declared", allow=LOOPBACK_ONLY, max_bytes=100_000)
    assert e.status == 413 and str(STREAM_TOTAL) in e.detail, e.detail


def test_a_slow_server_times_out(images):
    server, base = images
    t = time.monotonic()
    e = _refused(f"{base}/slow", allow=LOOPBACK_ONLY, timeout_s=0.5)
    assert e.status == 422 and "timed out" in e.detail and time.monotonic() - t < 2.5, e.detail


def test_several_urls_are_fetched_concurrently_over_one_client(images):
    """The server answers only once 4 requests are in flight at once: sequential fetches would fail."""
    server, base = images

    async def run():
        policy = parse_allow(LOOPBACK_ONLY)
        assert client_for(policy) is client_for(policy)
        return await fetch_images([f"{base}/barrier?n={i}" for i in range(4)], 1000, 10.0, allow=LOOPBACK_ONLY)

    assert asyncio.run(run()) == [b"0", b"1", b"2", b"3"]


# ------------------------------------------------------------------------------------ through the ingress
class _Reranker:
    """Stands in for the reranker deployment: records the images it is asked to add."""

    def __init__(self):
        self.added = []
        self.add_image = SimpleNamespace(remote=self._add)

    async def _add(self, data, image_id, source):
        self.added.append((data, source))
        return SimpleNamespace(status=200, image_id=image_id or "live-x", sha256="0" * 64, corpus_size=1, detail="")


def _api(tmp_path, **config):
    """The ingress's FastAPI app (its real routes and fetch call) with a stand-in reranker; no Ray Serve."""
    from fastapi.testclient import TestClient

    from edje.model.ranking import RankingConfig
    from edje.serving.config import ServeConfig
    from edje.serving.ingress import Ingress, build_api
    from edje.serving.shards import ShardedCorpus

    cfg = ServeConfig(miner_image_tables=("unused",), caption_sources=("unused",), live_dir=str(tmp_path),
                      auth_token_env=None, **config)
    ing = object.__new__(Ingress.func_or_class)  # the class Serve deploys, without Serve's replica wrapper
    ing.config, ing.auth_token, ing.checkpoint_meta, ing.ranking = cfg, None, None, RankingConfig()
    reranker = _Reranker()
    ing.corpus, ing.miner = ShardedCorpus([reranker], []), None
    return TestClient(build_api(ing)), reranker


def test_the_ingress_answers_422_for_a_loopback_url_by_default(images, tmp_path, connect_guard):
    server, base = images
    client, reranker = _api(tmp_path)
    r = client.post("/v1/images", json={"url": f"{base}/img"})
    assert r.status_code == 422 and r.json()["detail"].startswith("url: image urls on host '127.0.0.1'"), r.text
    r = client.post("/v1/rerank", json={"query": "q", "documents": [{"image": f"{base}/img"}]})
    assert r.status_code == 422 and r.json()["detail"].startswith("documents.0: ") and "loopback" in r.text, r.text
    assert server.paths == [] and reranker.added == [] and connect_guard.attempts == []


def test_the_ingress_fetches_a_loopback_url_with_the_allow_option(images, tmp_path):
    server, base = images
    client, reranker = _api(tmp_path, image_url_allow=LOOPBACK_ONLY)
    r = client.post("/v1/images", json={"url": f"{base}/img", "id": "copy"})
    assert r.status_code == 200, r.text
    assert reranker.added == [(BODY, f"{base}/img")]
