"""The Fleet gate: the only part of a deployed SuperLink the network sees (docs/flower.md).

Flower 1.41's SuperLink serves three APIs on one HTTP port (`--host`, `--port`): the Fleet
API (`/v1/fleet/...`, what SuperNodes call), the Control API (`/v1/control/...`: `flwr run`,
`flwr supernode register`; open-source Flower has no account authentication for it, OpenID
Connect being a Flower Enterprise feature) and the Runtime API (`/v1/runtime/...`, the
ServerApp processes). Whoever reaches that port can therefore submit runs, that is run code
on the SuperLink's machine. The secure deployment binds the SuperLink to loopback (its
default `--host 127.0.0.1`) and puts this gate on the network address instead: a TLS server
that forwards `POST /v1/fleet/<call>` to the SuperLink, byte for byte and streamed both ways
(SuperNode authentication, TLS checks and every other rule stay the SuperLink's), and answers
every other method and path with 404 without contacting the SuperLink. Only processes on the
SuperLink's machine (or an operator's SSH tunnel to it) can then reach the Control API.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from protofed.errors import ConfigError

log = logging.getLogger("protofed.flower.fleet_gate")

FLEET_PATH = re.compile(r"/v1/fleet/[a-z][a-z-]*")
"""The Fleet API's calls (register-node, pull-messages, push-object, ...): all POST."""
HOP_BY_HOP = frozenset(
    (
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
    )
)
"""Headers of one connection, not of the message: never forwarded (`host` is the gate's)."""
REFUSED = b"not served here: this address passes only the Fleet API (POST /v1/fleet/...)\n"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def split_address(address: str, what: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets) as (host, port); a ConfigError otherwise."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} {address!r} is not HOST:PORT")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback interface only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class FleetGate:
    """An ASGI application: `POST /v1/fleet/<call>` to `upstream`, everything else 404."""

    def __init__(self, upstream: str, ca_file: Path, timeout_s: float = 120.0) -> None:
        host, port = split_address(upstream, "--superlink")
        if not is_loopback(host):
            raise ConfigError(
                f"--superlink {upstream}: the SuperLink must listen on loopback only "
                "(flower-superlink --host 127.0.0.1), or the network reaches its Control API"
            )
        self.base = f"https://{'[' + host + ']' if ':' in host else host}:{port}"
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.timeout_s = timeout_s
        self.client: Any = None
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            if scope["method"] == "POST" and FLEET_PATH.fullmatch(scope["path"]):
                await self.forward(scope, receive, send)
            else:
                self.refused += 1
                peer = scope.get("client") or ("?", 0)
                log.warning("refused %s %s from %s", scope["method"], scope["path"], peer[0])
                await respond(send, 404, REFUSED)
        # websockets and anything else: no handler, the server closes the connection

    async def lifespan(self, receive: Receive, send: Send) -> None:
        import httpx

        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                timeout = httpx.Timeout(self.timeout_s, connect=10.0)
                self.client = httpx.AsyncClient(verify=self.context, timeout=timeout)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.client is not None:
                    await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        import httpx

        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        url = self.base + scope["path"]
        request = self.client.build_request("POST", url, headers=headers, content=body(receive))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as err:
            log.warning("the SuperLink at %s does not answer: %s", self.base, err)
            await respond(send, 502, b"the SuperLink does not answer\n")
            return
        try:
            raw = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": raw}
            )
            async for chunk in response.aiter_raw():  # as sent: no decoding, no re-encoding
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


async def body(receive: Receive) -> AsyncIterator[bytes]:
    """A request's body as the client sends it."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def respond(send: Send, status: int, text: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(text)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text})


def build_gate(superlink: str, certfile: Path, keyfile: Path, ca_file: Path) -> FleetGate:
    """The gate for a SuperLink at `superlink` (loopback only), its files checked first."""
    for path in (certfile, keyfile, ca_file):
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
    return FleetGate(superlink, ca_file)


def serve_gate(app: FleetGate, listen: str, certfile: Path, keyfile: Path) -> None:
    """Serve the gate on `listen` with TLS (the SuperLink's certificate, if its names include
    the address SuperNodes dial, or another one from the same CA) until interrupted."""
    import uvicorn

    host, port = split_address(listen, "--listen")
    uvicorn.run(
        app,
        host=host,
        port=port,
        ssl_certfile=str(certfile),
        ssl_keyfile=str(keyfile),
        log_level="warning",
        lifespan="on",
        access_log=False,
    )
