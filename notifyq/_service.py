"""``notifyq serve``: the worker (with maintenance and the listener) and the admin API in one
process and one anyio task group.

SIGTERM/SIGINT: hypercorn stops accepting connections and finishes the requests in flight, the
worker stops claiming, gives running handlers ``shutdown_grace_s`` and releases the rest; then
the embedded PostgreSQL (if this process started or reattached to it) is stopped, and the
process exits 0.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskStatus
from pydantic import SecretStr

from notifyq._app import App
from notifyq._dispatch.worker import Worker
from notifyq._errors import ConfigError
from notifyq._keys.keeper import KeyKeeper
from notifyq._version import VERSION

if TYPE_CHECKING:
    from hypercorn.config import Config

log = logging.getLogger("notifyq.serve")

KEEP_ALIVE_S = 5
"""hypercorn's keep-alive timeout (its default, stated): an idle connection, or one still
sending its headers, is closed after this."""
MAX_HEADER_BYTES = 16 * 1024
"""The most a request's headers may take (hypercorn's ``h11_max_incomplete_size``, its default
stated): a token, a session cookie and a browser's usual headers fit in 4 KiB."""


@dataclass(frozen=True)
class ServeOptions:
    host: str | None = None
    port: int | None = None
    worker: bool = True
    api: bool = True
    token_dir: Path | None = None
    """Where a generated admin token is kept (no token configured, loopback only). Defaults
    to the user data directory (``quickstart.default_dir``)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(app: App, host: str) -> None:
    """Refuse to expose an API nobody has to authenticate to."""
    from notifyq._http.auth import Authenticator

    if not is_loopback(host) and not Authenticator(app.settings.api).configured:
        raise ConfigError(
            f"refusing to serve the admin API on non-loopback address {host!r} without a token: "
            "set NOTIFYQ_ADMIN_TOKEN (and/or NOTIFYQ_READ_TOKEN), or bind 127.0.0.1")


async def serve(app: App, options: ServeOptions) -> int:
    """Run until SIGTERM/SIGINT; return the exit code."""
    if not (options.worker or options.api):
        raise ConfigError("--no-worker and --no-api together leave nothing to run")
    cfg = app.settings.api
    host = options.host or cfg.host
    port = cfg.port if options.port is None else options.port
    if options.api:
        check_bind(app, host)
        check_address_free(_api_config(app, host, port))
    from notifyq._api.app import ServiceState

    state = ServiceState()
    stop = anyio.Event()
    app._runtime.key_holder.role = "serve"
    async with app, anyio.create_task_group() as tg:
        # The first line once the start checks passed (a failed start is its one error line).
        log.info("notifyq %s serve starting (pid %d)", VERSION, os.getpid())
        if options.api:  # once the database answered: a failed start leaves no token behind
            _quick_start_token(app, options.token_dir)
        tg.start_soon(_stop_on_signal, stop)
        if app.has_keyring and not options.worker:  # a worker runs its own keeper
            keeper = KeyKeeper(app._runtime)
            keeper.wake()  # check (and count as a key holder) from the start
            tg.start_soon(keeper.run)
        async with anyio.create_task_group() as main:
            if options.worker:
                worker: Worker = await main.start(_run_worker, app, stop)
                worker.executor.observer = lambda e, outcome, s: state.metrics.observe(
                    e, outcome, s, now=app.clock.now())
                state.worker = worker
                worker.announcer.observer = state.metrics.operator_event
                if app._deliverer is not None:
                    app._deliverer.observer = state.metrics.webhook_attempt
            if options.api:
                main.start_soon(_serve_api, app, state, host, port, stop)
            else:
                await stop.wait()
        tg.cancel_scope.cancel()
    log.info("stopped")
    return 0


async def _run_worker(app: App, stop: anyio.Event,
                      *, task_status: TaskStatus[Worker] = anyio.TASK_STATUS_IGNORED) -> None:
    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:
            tg.start_soon(_cancel_when, stop, scope)
            await app.run_worker(task_status=task_status)
        tg.cancel_scope.cancel()
    stop.set()  # a worker that ends (it failed, or was stopped) takes the API down with it


async def _cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _quick_start_token(app: App, directory: Path | None) -> None:
    """No token configured (and, check_bind made sure, a loopback address): use the admin
    token kept in ``directory`` (generated on the first start) and say in one line where it
    is. The token itself is never printed or logged."""
    from notifyq._http import quickstart
    from notifyq._http.auth import Authenticator

    api = app.settings.api
    if Authenticator(api).configured:
        return
    path, token, created = quickstart.admin_token(directory or quickstart.default_dir())
    app.settings = app.settings.model_copy(
        update={"api": api.model_copy(update={"admin_token": SecretStr(token)})})
    where = shlex.quote(str(path))
    print(f"notifyq: no API token is configured: {'generated' if created else 'using'} an "
          f"admin token in {where} (only you can read it); use it with "
          f"`export NOTIFYQ_ADMIN_TOKEN=$(cat {where})`, or set NOTIFYQ_ADMIN_TOKEN yourself "
          "to choose the token", file=sys.stderr, flush=True)


def _api_config(app: App, host: str, port: int) -> Config:
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("notifyq.api.server")
    config.graceful_timeout = app.settings.worker.shutdown_grace_s
    config.include_server_header = False
    api = app.settings.api
    # A connection that sends nothing for this long is closed, mid-request too (issue 31: none
    # of 60 stalled clients was, in 30 s). Bodies have their own, shorter deadline
    # (api.body_timeout_s, BodyLimit); headers are bounded by the keep-alive timer, which
    # hypercorn runs until a request's headers are complete.
    config.read_timeout = api.read_timeout_s
    config.keep_alive_timeout = KEEP_ALIVE_S
    config.h11_max_incomplete_size = MAX_HEADER_BYTES
    return config


def check_address_free(config: Config) -> None:
    """Bind the API's address once before anything starts, so an address in use (or not on
    this host) is one line naming it; hypercorn would find out later, inside a task group,
    and its error does not say which address."""
    try:
        sockets = config.create_sockets()
    except OSError as exc:
        raise _bind_error(config, exc) from None
    for sock in sockets.insecure_sockets:
        sock.close()


def _bind_error(config: Config, exc: OSError) -> ConfigError:
    todo = ("another process listens there: stop it, or choose another port with --port "
            "(NOTIFYQ_API__PORT)" if exc.errno == errno.EADDRINUSE else
            "choose an address of this host with --host (NOTIFYQ_API__HOST)")
    return ConfigError(f"cannot listen on {config.bind[0]} for the admin API "
                       f"({exc.strerror or exc}): {todo}")


async def _serve_api(app: App, state: object, host: str, port: int, stop: anyio.Event) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve

    from notifyq._api.app import ServiceState, create_api

    assert isinstance(state, ServiceState)  # noqa: S101
    config = _api_config(app, host, port)
    log.info("admin API on http://%s:%d (OpenAPI at /v1/openapi.json)", host, port)
    print(f"notifyq: dashboard at {dashboard_url(host, port)} (sign in with an API token)",
          file=sys.stderr, flush=True)
    try:
        await hypercorn_serve(create_api(app, state), config,  # type: ignore[arg-type]
                              shutdown_trigger=stop.wait)
    except OSError as exc:  # taken between check_address_free and now
        raise _bind_error(config, exc) from None
    stop.set()


def dashboard_url(host: str, port: int) -> str:
    """Where a browser on this host finds the dashboard (a wildcard bind is reached on
    loopback)."""
    if host in ("0.0.0.0", "::", "[::]", ""):  # noqa: S104 - naming the wildcard, not binding
        host = "127.0.0.1"
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}/ui/"


async def _stop_on_signal(stop: anyio.Event) -> None:
    """The first SIGTERM/SIGINT starts the graceful shutdown; later ones are only logged."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if stop.is_set():
                log.warning("received %s again: still shutting down (releasing runs)", name)
                continue
            log.info("received %s: shutting down", name)
            stop.set()
