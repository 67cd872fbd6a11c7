"""Who may reach a server: its token, and the Host and Origin rules, with no web framework in them.

One bound to loopback needs no token, any other address one (given or generated). Given the address it is bound to,
a server answers only a ``Host`` naming it (no DNS rebinding; any name when bound to every interface with a token),
and a browser's WebSocket or change (any method but GET, HEAD, OPTIONS) only from a page of an allowed host
(``Origin``) or of an origin the operator allows (``--allow-origin``: a WHEP player's page elsewhere), which is also
answered with the CORS headers a browser needs to read the answer. The front end's aiohttp middleware
(``serving.http``) and the cluster's ingress (``cluster.ingress``) both ask ``Access.check``.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, token: str | None) -> tuple[str | None, bool]:
    """(token to require, whether it was generated): beyond loopback a token is mandatory."""
    if token or is_loopback(host):
        return token or None, False
    return secrets.token_urlsafe(16), True


def allowed_hosts(bound: tuple[str, int] | None, token: str | None) -> frozenset[str] | None:
    """The ``Host`` values a server bound to ``bound`` answers (lower case, with the port); None: any.

    Loopback and every-interface binds answer the loopback names; bound to every interface with a
    token, any name (the machine's names are not known, the token guards it); no ``bound``: any.
    """
    if bound is None:
        return None
    host, port = bound
    wildcard = host in ("", "0.0.0.0", "::")
    if wildcard and token:
        return None
    names = {f"[{host}]" if ":" in host else host}
    if wildcard or is_loopback(host):
        names |= {"127.0.0.1", "localhost", "[::1]"}
    names -= {"", "0.0.0.0", "[::]"}
    hosts = {f"{name}:{port}".lower() for name in names}
    return frozenset(hosts | ({name.lower() for name in names} if port == 80 else set()))


@dataclass(frozen=True)
class Refusal:
    """Why a request is not let in: its HTTP status (400, 401 or 403) and what to do instead."""

    status: int
    text: str


CORS_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type"
CORS_MAX_AGE = "600"


def origin_name(origin: str) -> str:
    """``origin`` as a browser sends it (``scheme://host[:port]``, lower case); ValueError for anything else."""
    parts = urlsplit(origin.strip().lower())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"an origin is scheme://host[:port], e.g. https://player.example, got {origin!r}")
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class Access:
    """A server's rules: the token it requires (None: none), the ``Host`` values it answers (None: any) and the pages
    of other origins that may use it from a browser (none by default)."""

    token: str | None
    hosts: frozenset[str] | None
    origins: frozenset[str] = frozenset()

    @classmethod
    def bound(cls, address: tuple[str, int] | None, token: str | None, origins: tuple[str, ...] = ()) -> Access:
        """The rules of a server bound to ``address`` (None: any Host) with ``token``, allowing ``origins``."""
        return cls(token or None, allowed_hosts(address, token), frozenset(origin_name(o) for o in origins))

    def cors(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The CORS headers of an answer to a request from an allowed origin's page (none for any other)."""
        origin = headers.get("Origin", "")
        if origin.lower() not in self.origins:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Access-Control-Expose-Headers": "Location", "Vary": "Origin"}

    def preflight(self, method: str, headers: Mapping[str, str]) -> dict[str, str] | None:
        """The headers of a 204 answering a CORS preflight from an allowed origin; None when it is not one (a browser
        sends no token with a preflight, so it is answered before the token is asked for)."""
        cors = self.cors(headers)
        if method != "OPTIONS" or not cors or "Access-Control-Request-Method" not in headers:
            return None
        host = headers.get("Host", "").lower()
        if self.hosts is not None and host not in self.hosts:
            return None
        return {
            **cors,
            "Access-Control-Allow-Methods": CORS_METHODS,
            "Access-Control-Allow-Headers": CORS_HEADERS,
            "Access-Control-Max-Age": CORS_MAX_AGE,
        }

    def check(self, method: str, headers: Mapping[str, str], query_token: str = "") -> Refusal | None:
        """None when a request may in; ``headers`` as the framework gives them (case-insensitive), ``query_token``
        the ``?token=`` parameter (a browser page's URL carries it to viewers)."""
        host = headers.get("Host", "").lower()
        if self.hosts is not None and host not in self.hosts:
            return Refusal(
                403, f"Host {host!r} is not a name this server is bound to; use one of: {', '.join(sorted(self.hosts))}"
            )
        origin = headers.get("Origin")
        changes = method not in ("GET", "HEAD", "OPTIONS") or headers.get("Upgrade", "").lower() == "websocket"
        if origin is not None and changes:
            page = urlsplit(origin).netloc.lower() if origin != "null" else ""
            allowed = origin.lower() in self.origins
            if not allowed and (not page or (page != host and (self.hosts is None or page not in self.hosts))):
                return Refusal(
                    403,
                    f"Origin {origin!r} may not push, signal or open sessions here: open the page this server serves "
                    f"(http://{host}/), connect without a browser, or start the server with --allow-origin {origin}",
                )
        if self.token is None:
            return None
        given = query_token
        header = headers.get("Authorization", "")
        if header.startswith("Bearer "):
            given = header[len("Bearer ") :]
        if not given.isascii():
            return Refusal(
                400, "the token is ASCII: ?token=TOKEN or Authorization: Bearer TOKEN, as the server printed it"
            )
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return Refusal(401, "a token is required: ?token=TOKEN or Authorization: Bearer TOKEN")
        return None
