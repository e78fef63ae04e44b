"""Who is calling: service and engine identities from the authenticated channel.

Two ways to prove an identity, both optional and both configured by the operator:
- mutual TLS: the client certificate's common name is the principal
  (`service:router`, `engine:decode-0`), checked against the CA the server trusts;
- bearer tokens: `authorization: Bearer <token>` whose SHA-256 is stored in the
  `credentials` table (`boomerang credentials create PRINCIPAL` prints the token once).

A principal is `service:<name>` (may act for any engine) or `engine:<engine_id>` (may only
register, heartbeat and retain blocks as itself). Identity never comes from request fields.
TLS files come from `BOOMERANG_TLS_*` variables so every server and client picks them up.

Callers with neither (anonymous) are let in only where that is safe or asked for, see
`AnonymousAccess`: never beyond loopback unless `BOOMERANG_INSECURE_ALLOW_ANONYMOUS=true`.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import grpc

TOKEN_PREFIX = "bmr_"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    kind: str  # "service", "engine" or "anonymous"
    name: str

    @classmethod
    def parse(cls, text: str) -> Principal:
        """`service:NAME` or `engine:ID`; ValueError otherwise."""
        kind, sep, name = text.partition(":")
        if not sep or kind not in ("service", "engine") or not name or len(name) > 128:
            raise ValueError(f"principal must be service:NAME or engine:ENGINE_ID, got {text!r}")
        return cls(kind, name)

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    def may_act_for_engine(self, engine_id: str) -> bool:
        """Services act for any engine; an engine only for itself; anonymous only where admitted as trusted.

        An anonymous caller acts for engines only as `LOCAL_ANONYMOUS` (a loopback-only
        listener with nothing configured) or `INSECURE_ANONYMOUS` (the development setting).
        """
        if self.kind == "anonymous":
            return self in (LOCAL_ANONYMOUS, INSECURE_ANONYMOUS)
        return self.kind == "service" or (self.kind == "engine" and self.name == engine_id)


ANONYMOUS = Principal("anonymous", "")
# The anonymous caller as admitted by each `AnonymousAccess` that lets it in.
LOCAL_ANONYMOUS = Principal("anonymous", "loopback")
INSECURE_ANONYMOUS = Principal("anonymous", "insecure")


class AnonymousAccess(enum.Enum):
    """What a gRPC service does with callers that present no certificate and no token."""

    # BOOMERANG_REQUIRE_AUTH=true, or a listener beyond loopback without the development
    # setting: UNAUTHENTICATED.
    REFUSED = "refused"
    # A loopback-only listener (127.0.0.0/8, ::1, localhost) with nothing configured: anonymous
    # callers may do everything a service may (`boomerang up`, local tests stay zero-config).
    # Any local user can reach such a port: on a shared host set BOOMERANG_REQUIRE_AUTH=true.
    LOOPBACK = "loopback"
    # BOOMERANG_INSECURE_ALLOW_ANONYMOUS=true: as LOOPBACK, on any listener. Development only.
    INSECURE = "insecure"

    @property
    def principal(self) -> Principal | None:
        """The principal an anonymous caller gets, or None when it is refused."""
        return {AnonymousAccess.LOOPBACK: LOCAL_ANONYMOUS, AnonymousAccess.INSECURE: INSECURE_ANONYMOUS}.get(self)


def is_loopback(listen: str) -> bool:
    """Whether HOST:PORT binds loopback only (127.0.0.0/8, ::1 or `localhost`).

    Wildcards (0.0.0.0, ::) and every other name or address count as beyond loopback: a
    host name is not resolved, since what it resolves to can change after start-up.
    """
    host = listen.rpartition(":")[0].strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def anonymous_access(listen: str, require_auth: bool, insecure_allow_anonymous: bool) -> AnonymousAccess:
    """The anonymous policy of a service listening on `listen` (ValueError for contradictory settings)."""
    if require_auth and insecure_allow_anonymous:
        raise ValueError("BOOMERANG_REQUIRE_AUTH and BOOMERANG_INSECURE_ALLOW_ANONYMOUS contradict each other; set one")
    if require_auth:
        return AnonymousAccess.REFUSED
    if insecure_allow_anonymous:
        return AnonymousAccess.INSECURE
    return AnonymousAccess.LOOPBACK if is_loopback(listen) else AnonymousAccess.REFUSED


def new_token() -> str:
    """A fresh high-entropy bearer token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> bytes:
    """The stored form of a token (SHA-256; tokens are random, so no salt is needed)."""
    return hashlib.sha256(token.encode()).digest()


def bearer_token(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str:
    """The bearer token in call metadata, or ''."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


def tls_common_name(context: grpc.aio.ServicerContext) -> str:
    """The verified client certificate's common name, or ''."""
    auth = context.auth_context() or {}
    names = auth.get("x509_common_name") or []
    return names[0].decode() if names else ""


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one side of a TLS connection (all optional)."""

    cert: str = ""
    key: str = ""
    ca: str = ""

    @classmethod
    def from_env(cls) -> TlsFiles:
        """`BOOMERANG_TLS_CERT_FILE`, `BOOMERANG_TLS_KEY_FILE`, `BOOMERANG_TLS_CA_FILE`."""
        return cls(
            os.environ.get("BOOMERANG_TLS_CERT_FILE", ""),
            os.environ.get("BOOMERANG_TLS_KEY_FILE", ""),
            os.environ.get("BOOMERANG_TLS_CA_FILE", ""),
        )

    @property
    def enabled(self) -> bool:
        """Whether this side uses TLS at all."""
        return bool(self.cert and self.key) or bool(self.ca)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server TLS; with a CA, clients must present a certificate it signed (mutual TLS)."""
        if not (self.cert and self.key):
            raise ValueError("a TLS server needs BOOMERANG_TLS_CERT_FILE and BOOMERANG_TLS_KEY_FILE")
        ca = _read(self.ca)
        return grpc.ssl_server_credentials(
            [(_read(self.key), _read(self.cert))], root_certificates=ca, require_client_auth=ca is not None
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client TLS: trust the CA, present our certificate when we have one."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca),
            private_key=_read(self.key) if self.cert else None,
            certificate_chain=_read(self.cert) if self.cert else None,
        )


def client_token() -> str:
    """The bearer token this process presents to Boomerang services.

    `BOOMERANG_AUTH_TOKEN`, else the first line of the file `BOOMERANG_AUTH_TOKEN_FILE` names
    (read each time a client is made, so a rotated file is picked up by the next channel).
    """
    token = os.environ.get("BOOMERANG_AUTH_TOKEN", "")
    path = os.environ.get("BOOMERANG_AUTH_TOKEN_FILE", "")
    if token or not path:
        return token
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"BOOMERANG_AUTH_TOKEN_FILE {path!r} cannot be read: {exc.strerror}") from None
    return lines[0].strip() if lines else ""
