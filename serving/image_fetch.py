"""Image bytes for the ingress: http(s) urls fetched with a size and time limit, base64 decoded with a size limit.

Every failure is the client's input and becomes an ImageInputError with a 4xx status: 413 when the
image is larger than allowed, 422 when a url cannot be fetched (refused, unresolvable, timed out,
an error status) or the text is not base64. Decoding the pixels is the reranker's job
(serving/live_images.py), where corrupt images and decompression bombs are refused.

Server-side request forgery: a url names a host the client chose, so by default the server connects only
to public addresses. The host is resolved here, every address it resolves to is checked, and the
connection goes to a checked address (the url's host name stays in the Host header and the TLS SNI), so
a name that resolves differently on a second lookup (DNS rebinding) cannot reach a refused address.
Redirects are followed one hop at a time and each hop's connection is checked the same way. Loopback,
private, link-local (169.254.169.254, the cloud metadata service), multicast, reserved and unspecified
addresses, IPv4 ones embedded in IPv6 included, are refused unless `allow` names them
(`ServeConfig.image_url_allow`).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import ipaddress
import socket
from dataclasses import dataclass
from typing import Collection, Dict, FrozenSet, Iterable, List, Optional, Tuple, Union

import httpcore
import httpx

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

MAX_REDIRECTS = 5
HEADERS = {"User-Agent": "edje-reranker/1", "Accept": "image/*",
           # Images are compressed already; an encoded body would only make the byte cap count decoded bytes late.
           "Accept-Encoding": "identity"}
# Named groups of addresses `allow` may use besides CIDRs and host names.
ALLOW_GROUPS: Dict[str, Tuple[str, ...]] = {"loopback": ("127.0.0.0/8", "::1/128")}
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # a NAT64 gateway forwards to the IPv4 address in the low 32 bits


class ImageInputError(ValueError):
    """An image the client gave that cannot be used: an HTTP status (4xx) and a message."""

    def __init__(self, status: int, detail: str):
        self.status, self.detail = status, detail
        super().__init__(detail)


# ------------------------------------------------------------------------------------ address policy
def _embedded_ipv4(ip: IPAddress) -> Optional[ipaddress.IPv4Address]:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo client, NAT64), if any."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped:
        return ip.ipv4_mapped
    if ip.sixtofour:
        return ip.sixtofour
    if ip.teredo:
        return ip.teredo[1]
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_kind(ip: IPAddress) -> Optional[str]:
    """Why an address is not public ('loopback', 'private', 'link-local', ...), or None for a public one."""
    inner = _embedded_ipv4(ip)
    inner_kind = address_kind(inner) if inner is not None else None
    if inner_kind:
        return inner_kind
    for kind, flag in (("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback),
                       ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                       ("private", ip.is_private), ("reserved", ip.is_reserved)):
        if flag:
            return kind
    # Shared address space (100.64/10, carrier NAT) and other special ranges are not global either.
    return None if ip.is_global else "non-public"


@dataclass(frozen=True)
class AddressPolicy:
    """Which addresses a fetch may connect to: public ones, plus the allowed networks and host names."""

    networks: Tuple[IPNetwork, ...] = ()
    hosts: FrozenSet[str] = frozenset()

    def allows_host(self, host: str) -> bool:
        """True when the host name itself is allowed, whatever it resolves to."""
        return _host_key(host) in self.hosts

    def refusal(self, ip: IPAddress) -> Optional[str]:
        """Why a connection to `ip` is refused ('a loopback address'), or None when it is allowed."""
        kind = address_kind(ip)
        if kind is None:
            return None
        candidates = (ip, _embedded_ipv4(ip))
        if any(c is not None and c.version == net.version and c in net for c in candidates for net in self.networks):
            return None
        return f"a {kind} address"


def _host_key(host: str) -> str:
    return host.lower().rstrip(".")


@functools.lru_cache(maxsize=64)
def parse_allow(allow: Optional[Tuple[str, ...]]) -> AddressPolicy:
    """An AddressPolicy of `allow` entries: CIDRs or addresses, 'loopback', or host names; ValueError on a bad one."""
    networks: List[IPNetwork] = []
    hosts = set()
    for entry in allow or ():
        entry = entry.strip()
        if entry.lower() in ALLOW_GROUPS:
            networks += [ipaddress.ip_network(n) for n in ALLOW_GROUPS[entry.lower()]]
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            if "/" in entry or ":" in entry or not entry:
                raise ValueError(f"image_url_allow: {entry!r} is not a network, an address, 'loopback' "
                                 "or a host name") from None
        hosts.add(_host_key(entry))
    return AddressPolicy(tuple(networks), frozenset(hosts))


async def resolve_checked(host: str, port: int, policy: AddressPolicy) -> List[IPAddress]:
    """The addresses to connect to for host:port, each one checked; ImageInputError (422) when any is refused."""
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:  # a host name: resolve it here, so that the addresses checked are the ones connected to
        addresses = await _resolve(host, port)
    _check(host, addresses, policy)
    return addresses


async def _resolve(host: str, port: int) -> List[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.run_in_executor(None, functools.partial(socket.getaddrinfo, host, port,
                                                                   type=socket.SOCK_STREAM))
    except (socket.gaierror, UnicodeError) as e:
        raise ImageInputError(422, f"cannot resolve host {host!r}: {e}") from None
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


def _check(host: str, addresses: List[IPAddress], policy: AddressPolicy) -> None:
    if policy.allows_host(host):
        return
    # Every address, not only the first: the connection may fall through to any of them.
    for ip in addresses:
        why = policy.refusal(ip)
        if why:
            what = f"{ip} is" if str(ip) == host else f"it resolves to {ip},"
            raise ImageInputError(422, f"image urls on host {host!r} are not fetched by this server: {what} {why} "
                                       "(allow it with image_url_allow)")


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore network backend that resolves and checks the host itself, then connects to a checked address."""

    def __init__(self, policy: AddressPolicy, inner: Optional[httpcore.AsyncNetworkBackend] = None):
        self.policy, self.inner = policy, inner or httpcore.AnyIOBackend()

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        """A stream to the first checked address of host that accepts; ImageInputError when any is refused."""
        addresses = await resolve_checked(host, port, self.policy)
        error: Optional[Exception] = None
        for ip in addresses:  # the next checked address when one refuses (e.g. ::1 first, a server on 127.0.0.1)
            try:
                return await self.inner.connect_tcp(str(ip), port, timeout=timeout, local_address=local_address,
                                                    socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                error = e
        raise error or httpcore.ConnectError(f"no address for {host!r}")

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        """Never: image urls name network hosts only."""
        raise ImageInputError(422, "unix sockets are not fetched by this server")

    async def sleep(self, seconds: float) -> None:
        """The inner backend's sleep (httpcore's retry backoff)."""
        await self.inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx transport whose every connection goes through a _GuardedBackend; no proxies from the environment."""

    def __init__(self, policy: AddressPolicy, limits: httpx.Limits):
        super().__init__(trust_env=False, limits=limits)
        # httpx builds its httpcore pool without a way to pass a network backend: build the same pool with one.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=_GuardedBackend(policy))


# One client per address policy, reused (its connections too) within an event loop. An httpx client belongs
# to the loop it first ran in: a client of another (closed) loop is replaced, not reused.
_CLIENTS: Dict[AddressPolicy, Tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}
LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=16, keepalive_expiry=30.0)


def client_for(policy: AddressPolicy) -> httpx.AsyncClient:
    """The shared AsyncClient of this policy in the running event loop."""
    loop = asyncio.get_running_loop()
    held = _CLIENTS.get(policy)
    if held is None or held[0] is not loop:
        held = _CLIENTS[policy] = (loop, httpx.AsyncClient(transport=_GuardedTransport(policy, LIMITS), headers=HEADERS,
                                                           follow_redirects=False, trust_env=False))
    return held[1]


# ------------------------------------------------------------------------------------------- fetching
def _checked_url(url: str, allowed_hosts: Optional[Collection[str]]) -> httpx.URL:
    """The url parsed, when its scheme is http(s) and its host is allowed (checked before any lookup)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as e:
        raise ImageInputError(422, f"not a valid url: {url}: {e}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ImageInputError(422, f"not an http(s) url: {url}")
    if allowed_hosts is not None and parsed.host not in allowed_hosts:
        raise ImageInputError(422, f"image urls on host {parsed.host!r} are not fetched by this server "
                                   f"(allowed: {sorted(allowed_hosts)})")
    return parsed


async def _read_capped(response: httpx.Response, url: str, max_bytes: int) -> bytes:
    """The body, read until it passes max_bytes (413 then, the rest never downloaded)."""
    length = response.headers.get("Content-Length")
    if length and length.isdigit() and int(length) > max_bytes:
        raise ImageInputError(413, f"image at {url} is {length} bytes, more than the limit {max_bytes}")
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > max_bytes:
            raise ImageInputError(413, f"image at {url} is more than the limit of {max_bytes} bytes")
    if not data:
        raise ImageInputError(422, f"image at {url} is empty")
    return bytes(data)


async def _fetch(client: httpx.AsyncClient, url: str, max_bytes: int, timeout_s: float,
                 allowed_hosts: Optional[Collection[str]]) -> bytes:
    hop = url
    for _ in range(MAX_REDIRECTS + 1):
        target = _checked_url(hop, allowed_hosts)
        async with client.stream("GET", target, timeout=httpx.Timeout(timeout_s)) as r:
            if r.is_redirect:
                # The next hop is checked like the first (host allowlist here, its addresses at connect).
                hop = str(r.url.join(r.headers["Location"]))
                continue
            if not r.is_success:
                raise ImageInputError(422, f"could not fetch {url}: the server answered {r.status_code} {r.reason_phrase}")
            return await _read_capped(r, url, max_bytes)
    raise ImageInputError(422, f"could not fetch {url}: more than {MAX_REDIRECTS} redirects")


async def fetch_image(url: str, max_bytes: int, timeout_s: float, allowed_hosts: Optional[Collection[str]] = None,
                      allow: Optional[Iterable[str]] = None) -> bytes:
    """The body at an http(s) url, fetched within timeout_s in all; ImageInputError on failure."""
    client = client_for(parse_allow(tuple(allow) if allow is not None else None))
    try:
        async with asyncio.timeout(timeout_s):  # the whole fetch, redirects and a slowly dripping body included
            return await _fetch(client, url, max_bytes, timeout_s, allowed_hosts)
    except ImageInputError:
        raise
    except (TimeoutError, httpx.TimeoutException):
        raise ImageInputError(422, f"could not fetch {url}: timed out after {timeout_s:g} s") from None
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as e:
        raise ImageInputError(422, f"could not fetch {url}: {e or type(e).__name__}") from None


async def fetch_images(urls: Iterable[str], max_bytes: int, timeout_s: float,
                       allowed_hosts: Optional[Collection[str]] = None, allow: Optional[Iterable[str]] = None) -> List[bytes]:
    """The bodies of several urls, fetched concurrently over the shared client; the first failure is raised."""
    allow = tuple(allow) if allow is not None else None
    return list(await asyncio.gather(*(fetch_image(u, max_bytes, timeout_s, allowed_hosts, allow) for u in urls)))


def decode_base64(text: str, max_bytes: int) -> bytes:
    """Bytes of base64 text (a data: url's payload or bare base64, whitespace allowed); ImageInputError on failure."""
    if text.startswith("data:"):
        text = text.split(",", 1)[1] if "," in text else ""
    text = "".join(text.split())
    if len(text) * 3 // 4 > max_bytes + 2:
        raise ImageInputError(413, f"base64 image is more than the limit of {max_bytes} bytes")
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageInputError(422, f"image is not valid base64: {e}") from None
    if not data:
        raise ImageInputError(422, "base64 image is empty")
    if len(data) > max_bytes:
        raise ImageInputError(413, f"base64 image is {len(data)} bytes, more than the limit {max_bytes}")
    return data


async def image_bytes(kind: str, value: str, max_bytes: int, timeout_s: float,
                      allowed_hosts: Optional[Collection[str]] = None,
                      allow: Optional[Iterable[str]] = None) -> Tuple[bytes, str]:
    """(bytes, source) of a ('url' | 'base64', value) reference; the source is the url, or '' for base64."""
    if kind == "url":
        return await fetch_image(value, max_bytes, timeout_s, allowed_hosts, allow), value
    return decode_base64(value, max_bytes), ""
