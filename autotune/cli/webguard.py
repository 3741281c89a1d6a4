"""The guard in front of optuna-dashboard: it answers only requests addressed to this server by a name it is
bound to, and takes writes only from its own page.

optuna-dashboard has no authentication, and its API writes (rename or delete a study, edit notes, tell
trials). Binding to 127.0.0.1 keeps other machines out, not other web pages: a page the user opens elsewhere
can point its own name at 127.0.0.1 (DNS rebinding) and talk to the dashboard as if it were its own site; the
browser then sends ``Host: <that name>``. So a request must name the server by a loopback name (``localhost``,
``127.x.x.x``, ``[::1]``), or, when it is bound to another address on purpose (``--host``), by an IP address or
this machine's own name: anything else gets 403 (docs/security.md). A write (any method but GET, HEAD and
OPTIONS) must also come from the dashboard's own page: a browser's ``Origin`` (else ``Referer``) must be the
address the request was sent to, and ``Sec-Fetch-Site``, where sent, ``same-origin``; a client that sends none
of them (curl, a script) is not a browser page and passes on the Host check alone.

>>> allowed_hosts("127.0.0.1")
frozenset({'localhost'})
>>> refusal({"HTTP_HOST": "evil.example:8080", "REQUEST_METHOD": "GET"}, allowed_hosts("127.0.0.1"))
"Host 'evil.example' is not a name this dashboard answers to: open it at http://127.0.0.1:PORT/"
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, Callable, Iterable

__all__ = ["guard", "refusal", "allowed_hosts", "is_loopback"]

_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(bound: str) -> frozenset[str]:
    """The host names (besides IP addresses, see ``refusal``) a server bound to ``bound`` answers to."""
    if is_loopback(bound):
        return frozenset({"localhost"})
    names = {"localhost", bound.lower(), socket.gethostname().lower()}
    try:
        names.add(socket.getfqdn().lower())
    except OSError:  # pragma: no cover - a resolver that fails
        pass
    return frozenset(names)


def _hostname(host: str) -> str:
    """``host`` of a Host header (``name``, ``name:port``, ``[v6]:port``), lower case, without a trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0].rstrip(".") if host.count(":") <= 1 else host


def _host_ok(name: str, names: frozenset[str]) -> bool:
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return name in names
    # an IP address is no DNS name, so no page elsewhere can rebind it; bound to loopback, only loopback ones
    return ip.is_loopback or names != frozenset({"localhost"})


def refusal(environ: dict[str, Any], names: frozenset[str]) -> str | None:
    """Why the request in WSGI ``environ`` is refused, or None when it may go through."""
    host = environ.get("HTTP_HOST", "")
    if not host:
        return "a request without a Host header"
    if not _host_ok(_hostname(host), names):
        return (f"Host {_hostname(host)!r} is not a name this dashboard answers to: open it at "
                "http://127.0.0.1:PORT/" if names == frozenset({"localhost"}) else
                f"Host {_hostname(host)!r} is not a name this dashboard answers to (its IP address or "
                f"{', '.join(sorted(names))})")
    if environ.get("REQUEST_METHOD", "GET").upper() in _SAFE_METHODS:
        return None
    own = f"http://{host.strip().lower()}"
    origin = environ.get("HTTP_ORIGIN")
    referer = environ.get("HTTP_REFERER")
    if origin is not None and origin.strip().lower().rstrip("/") != own:
        return f"a write from another site ({origin}): only the dashboard's own page may change the study"
    if origin is None and referer is not None and not (referer.lower() + "/").startswith(own + "/"):
        return "a write from another page: only the dashboard's own page may change the study"
    if environ.get("HTTP_SEC_FETCH_SITE", "same-origin") not in ("same-origin", "none"):
        return "a write from another site: only the dashboard's own page may change the study"
    return None


def guard(app: Callable, bound: str) -> Callable:
    """WSGI ``app`` behind the checks of ``refusal`` for a server bound to ``bound``; a refused request gets
    403 and one line of text saying why."""
    names = allowed_hosts(bound)

    def guarded(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        why = refusal(environ, names)
        if why is None:
            return app(environ, start_response)
        body = f"autotune dashboard: refused: {why}\n".encode()
        start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(body)))])
        return [body]

    return guarded
