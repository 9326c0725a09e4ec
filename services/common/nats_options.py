"""How a Steno process authenticates to NATS and secures the connection: the options
built from ``Settings`` (``STENO_NATS_*``) and checked before anything connects.

Credentials may sit in ``STENO_NATS_URL`` (``nats://user:password@host:4222``; several
servers comma-separated; ``tls://`` asks for TLS) or come from ``STENO_NATS_USER`` /
``STENO_NATS_PASSWORD``, a .creds file (``STENO_NATS_CREDS``: JWT + nkey) or an nkey seed
file (``STENO_NATS_NKEY_SEED``); one way at a time. TLS is on when the URL says ``tls://``
or a CA (``STENO_NATS_TLS_CA``) or client certificate (``STENO_NATS_TLS_CERT`` +
``STENO_NATS_TLS_KEY``) is configured.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from nats import errors as nats_errors
from nats.aio.client import Client

if TYPE_CHECKING:
    from steno.services.common.config import Settings

log = logging.getLogger(__name__)

CLOSE_AFTER_REFUSAL_S = 1.0

# The variable behind each setting, so that every error names what to fix.
URL_VAR = "STENO_NATS_URL"
USER_VAR = "STENO_NATS_USER"
PASSWORD_VAR = "STENO_NATS_PASSWORD"
CREDS_VAR = "STENO_NATS_CREDS"
NKEY_SEED_VAR = "STENO_NATS_NKEY_SEED"
TLS_CA_VAR = "STENO_NATS_TLS_CA"
TLS_CERT_VAR = "STENO_NATS_TLS_CERT"
TLS_KEY_VAR = "STENO_NATS_TLS_KEY"

# Each Settings field of NATS security, and the variable it is read from.
SECURITY_VARIABLES = {
    "nats_user": USER_VAR,
    "nats_password": PASSWORD_VAR,
    "nats_creds": CREDS_VAR,
    "nats_nkey_seed": NKEY_SEED_VAR,
    "nats_tls_ca": TLS_CA_VAR,
    "nats_tls_cert": TLS_CERT_VAR,
    "nats_tls_key": TLS_KEY_VAR,
}


class NatsSettingsError(ValueError):
    """The NATS settings cannot work as given; the message names the variable."""


class NatsRefused(ConnectionError):
    """A NATS server refused this process's credentials or TLS: retrying cannot help."""


class TlsNotOffered(nats_errors.Error):
    """TLS is configured but the server did not require it; nats-py would carry on in
    plain text. A subclass of nats-py's error, so that its reconnect loop treats it as a
    failed attempt."""


@dataclass(frozen=True)
class NatsOptions:
    """Everything a connection needs, checked. ``servers`` carry no credentials, so they
    may appear in logs and errors."""

    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    # A URL's user part without a password is a token (``nats://TOKEN@host``).
    token: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def from_url(cls, url: str) -> NatsOptions:
        """A URL alone (tests and benchmarks that reach a NATS of their own)."""
        servers, user, password, token, tls = _parse_url(url)
        return cls(servers, user=user, password=password, token=token, tls=tls)

    @classmethod
    def from_settings(cls, settings: Settings) -> NatsOptions:
        servers, url_user, url_password, token, url_tls = _parse_url(settings.nats_url)
        user, password = settings.nats_user, settings.nats_password
        if (user is None) != (password is None):
            missing, given = (PASSWORD_VAR, USER_VAR) if password is None else (USER_VAR, PASSWORD_VAR)
            raise NatsSettingsError(f"{given} is set but {missing} is not: set both or neither")
        if user is not None and (url_user is not None or token is not None):
            raise NatsSettingsError(
                f"credentials are given both in {URL_VAR} and in {USER_VAR}/{PASSWORD_VAR}: keep one of them"
            )
        ways = [name for name, given in (
            ("user and password", user is not None or url_user is not None),
            ("a token in the URL", token is not None),
            (CREDS_VAR, settings.nats_creds is not None),
            (NKEY_SEED_VAR, settings.nats_nkey_seed is not None),
        ) if given]
        if len(ways) > 1:
            raise NatsSettingsError(f"NATS credentials are given more than one way ({', '.join(ways)}): keep one")
        if (settings.nats_tls_cert is None) != (settings.nats_tls_key is None):
            raise NatsSettingsError(f"{TLS_CERT_VAR} and {TLS_KEY_VAR} go together: set both or neither")
        for variable, path in (
            (CREDS_VAR, settings.nats_creds),
            (NKEY_SEED_VAR, settings.nats_nkey_seed),
            (TLS_CA_VAR, settings.nats_tls_ca),
            (TLS_CERT_VAR, settings.nats_tls_cert),
            (TLS_KEY_VAR, settings.nats_tls_key),
        ):
            if path is not None:
                _check_readable(variable, path)
        if settings.nats_creds is not None:
            _check_creds_file(settings.nats_creds)
        if settings.nats_nkey_seed is not None:
            _check_seed_file(settings.nats_nkey_seed)
        return cls(
            servers,
            user=user if user is not None else url_user,
            password=password if password is not None else url_password,
            token=token,
            creds_file=settings.nats_creds,
            nkey_seed_file=settings.nats_nkey_seed,
            tls=url_tls or settings.nats_tls_ca is not None or settings.nats_tls_cert is not None,
            tls_ca=settings.nats_tls_ca,
            tls_cert=settings.nats_tls_cert,
            tls_key=settings.nats_tls_key,
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context that verifies the servers (against ``tls_ca``, else the system's
        CAs) and presents the client certificate; None without TLS."""
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise NatsSettingsError(f"{TLS_CA_VAR}: {self.tls_ca} is not a usable PEM CA bundle ({exc})") from exc
        if self.tls_cert is not None:
            try:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise NatsSettingsError(
                    f"{TLS_CERT_VAR}/{TLS_KEY_VAR}: {self.tls_cert} and {self.tls_key} are not a matching PEM "
                    f"certificate and key ({exc})"
                ) from exc
        return context

    def connect_kwargs(self) -> dict[str, Any]:
        """nats-py's ``connect`` arguments for these options (reconnect policy and
        callbacks excepted)."""
        kwargs: dict[str, Any] = {"servers": list(self.servers)}
        if self.user is not None:
            kwargs["user"] = self.user
            kwargs["password"] = self.password
        if self.token is not None:
            kwargs["token"] = self.token
        if self.creds_file is not None:
            kwargs["user_credentials"] = self.creds_file
        if self.nkey_seed_file is not None:
            kwargs["nkeys_seed"] = self.nkey_seed_file
        context = self.ssl_context()
        if context is not None:
            kwargs["tls"] = context
        return kwargs

    def describe(self) -> str:
        """For logs: servers, how this process authenticates, and TLS; never a secret."""
        if self.creds_file is not None:
            auth = f"credentials file {self.creds_file}"
        elif self.nkey_seed_file is not None:
            auth = f"nkey seed file {self.nkey_seed_file}"
        elif self.user is not None:
            auth = f"user {self.user}"
        elif self.token is not None:
            auth = "a token"
        else:
            auth = "no credentials"
        tls = "no TLS"
        if self.tls:
            tls = f"TLS (CA {self.tls_ca or 'of the system'}{', client certificate' if self.tls_cert else ''})"
        return f"{','.join(self.servers)} with {auth}, {tls}"


def redact_url(url: str) -> str:
    """A NATS URL (or comma-separated list) without its credentials, for logs."""
    return ",".join(_without_userinfo(server.strip()) for server in url.split(",") if server.strip())


def _without_userinfo(server: str) -> str:
    scheme, _, rest = server.rpartition("://")
    authority, slash, path = rest.partition("/")
    host = authority.rpartition("@")[2]
    return f"{scheme + '://' if scheme else ''}{host}{slash}{path}"


def _parse_url(url: str) -> tuple[tuple[str, ...], str | None, str | None, str | None, bool]:
    """Servers without credentials, the credentials they carried (user, password or a
    token), and whether any asks for TLS."""
    servers: list[str] = []
    found: set[tuple[str, str | None]] = set()
    tls = False
    for server in (s.strip() for s in url.split(",")):
        if not server:
            continue
        parts = urlsplit(server if "://" in server else f"nats://{server}")
        if parts.scheme not in ("nats", "tls"):
            raise NatsSettingsError(f"{URL_VAR}: {redact_url(server)} is neither nats:// nor tls://")
        tls = tls or parts.scheme == "tls"
        if parts.username is not None:
            found.add((unquote(parts.username), None if parts.password is None else unquote(parts.password)))
        servers.append(_without_userinfo(parts.geturl()))
    if not servers:
        raise NatsSettingsError(f"{URL_VAR} names no server")
    if len(found) > 1:
        raise NatsSettingsError(f"{URL_VAR}: its servers carry different credentials; give every server the same")
    if not found:
        return tuple(servers), None, None, None, tls
    (user, password), = found
    if password is None:
        return tuple(servers), None, None, user, tls
    return tuple(servers), user, password, None, tls


def _check_readable(variable: str, path: str) -> None:
    if not Path(path).is_file():
        raise NatsSettingsError(f"{variable}: no such file: {path}")
    if not os.access(path, os.R_OK):
        raise NatsSettingsError(f"{variable}: {path} is not readable by this process")


def _check_creds_file(path: str) -> None:
    text = Path(path).read_text(errors="replace")
    # nats-py reads the file at every connect and never returns from one without these.
    if "BEGIN NATS USER JWT" not in text or "BEGIN USER NKEY SEED" not in text:
        raise NatsSettingsError(f"{CREDS_VAR}: {path} is not a NATS .creds file (a user JWT and its nkey seed)")


def _check_seed_file(path: str) -> None:
    import nkeys  # only where a seed is configured

    seed = bytearray(Path(path).read_bytes().strip())
    try:
        nkeys.from_seed(seed).wipe()
    except Exception as exc:
        raise NatsSettingsError(f"{NKEY_SEED_VAR}: {path} does not hold an nkey seed") from exc
    finally:
        seed[:] = bytes(len(seed))


async def open_connection(options: NatsOptions, name: str, *, max_reconnect_attempts: int = -1) -> Client:
    """Connects with ``options``. Until the first connection a server that does not answer
    is retried (it may still be starting), but a refusal of the credentials or of a
    certificate raises NatsRefused at once: waiting does not mend configuration."""
    client = Client()
    connected = False
    refused: list[NatsRefused] = []

    async def on_error(exc: Exception) -> None:
        if refused:
            return  # the connection being torn down after a refusal: nothing new to say
        if not connected:
            refusal = _refusal(client, exc)
            if refusal is not None:
                refused.append(NatsRefused(refusal))
                # Raised from nats-py's connect loop, this ends the connect call.
                raise refused[0] from exc
        log.warning("nats: %s", exc)

    # nats-py types the wait as int, but sleeps for any number of seconds.
    kwargs = {**options.connect_kwargs(), "reconnect_time_wait": 0.5}
    if options.tls:
        # nats-py upgrades only when the server requires TLS; a server (or an impostor)
        # that does not must never see a secret in plain text.
        for secret in ("password", "token"):
            if kwargs.get(secret) is not None:
                kwargs[secret] = _only_over_tls(client, kwargs[secret])
    try:
        await client.connect(**kwargs, name=name, max_reconnect_attempts=max_reconnect_attempts, error_cb=on_error)
    except NatsRefused:
        # After a failed TLS handshake nats-py's close waits for a socket that never
        # reports closing; give it a moment, then leave the rest to the collector.
        with suppress(Exception):
            await asyncio.wait_for(client.close(), CLOSE_AFTER_REFUSAL_S)
        raise
    if options.tls and not _tls_in_effect(client):
        await client.close()
        raise NatsRefused(f"NATS server {_server_of(client)} does not require TLS, but TLS is configured "
                          f"({URL_VAR} tls://, {TLS_CA_VAR} or {TLS_CERT_VAR})")
    connected = True
    return client


def _tls_in_effect(client: Client) -> bool:
    # nats-py upgrades to TLS exactly when the server's INFO requires it.
    return bool(client._server_info.get("tls_required"))


def _server_of(client: Client) -> str:
    server = client._current_server
    return "?" if server is None else _without_userinfo(server.uri.geturl())


def _only_over_tls(client: Client, secret: str) -> Callable[[], str]:
    def give() -> str:
        if not _tls_in_effect(client):
            raise TlsNotOffered(f"nats: {_server_of(client)} does not require TLS, but TLS is configured: "
                                "the credentials were not sent")
        return secret

    return give


def _refusal(client: Client, exc: Exception) -> str | None:
    """What to tell the operator when ``exc`` means configuration, not a passing outage."""
    server = _server_of(client)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"the certificate of NATS server {server} cannot be verified ({exc.verify_message}): "
                f"set {TLS_CA_VAR} to the CA that signed it, and reach the server by a name the certificate holds")
    if isinstance(exc, ssl.SSLError):
        return (f"TLS with NATS server {server} failed ({exc.reason or exc}): "
                f"check {TLS_CA_VAR}, {TLS_CERT_VAR} and {TLS_KEY_VAR}")
    if isinstance(exc, TlsNotOffered):
        return str(exc).removeprefix("nats: ")
    if isinstance(exc, nats_errors.Error) and "authorization violation" in str(exc).lower():
        return (f"NATS server {server} refused the credentials (authorization violation): check {URL_VAR}, "
                f"{USER_VAR}/{PASSWORD_VAR}, {CREDS_VAR} or {NKEY_SEED_VAR}")
    return None
