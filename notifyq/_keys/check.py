"""The key check: a process's keyring compared with the database before it encrypts or decrypts.

Every process that holds a keyring (a worker, ``serve --no-worker``, the CLI, a web app calling
``app.keyring`` or ``app.webhooks``) runs it before its first encrypt or decrypt, and again once
``key_check_interval_s`` has passed since the last one succeeded (workers and ``serve`` also run
it every interval on their own, and at once when told by NOTIFY, see notifyq/_keys/keeper.py).
One check:

1. reads ``key_version`` with the cluster's active version (``key_active``) and refuses
   (``ConfigError``) a configured key whose check value differs from the recorded one; loads
   the retired versions into the keyring (they no longer decrypt);
2. only then records the check value of each configured version the table does not hold yet,
   and verifies again in the same transaction (a process that started meanwhile may have
   recorded another key under the same new version: the refusal rolls ours back). A refused
   check writes nothing: recording first let ``1:<wrong>,2:<new>`` store 2's check value before
   1 was refused, and the right deployment with another key 2 was refused after it (issue 31);
3. sets the keyring's active version to the cluster's. ``NOTIFYQ_ACTIVE_KEY_VERSION`` is the
   first value (when the cluster has none) and a request: a version newer than the active one
   and never active before is promoted by the check of a process that asks for it (not of a CLI
   command), on the same terms as ``notifyq keys promote`` (every live process holds it, no
   rotation to another version is under way), so a rolling deploy that sets it everywhere
   switches once the last process holds the key. Until then the process follows the cluster's
   version and says why once in its log;
4. records the process as a key holder (``key_holder``: the versions it holds by check value,
   the one it encrypts under), alive for three intervals, so a promotion can tell whether every
   live process holds the version (skipped for short-lived CLI commands, ``holder.role`` None);
5. records in ``encrypted_column`` the columns this process registered that it has not recorded
   yet, so ``keys status``, ``rotate`` and ``retire`` count them in every process.

A process whose keys lack the active version keeps decrypting what it holds and refuses to
encrypt (``Keyring.encrypt``) rather than write under an older key: an operator who promoted a
version to stop using the old one (it leaked, say) must not find new rows under it, and the
refusal names the missing version where the misdeploy is. A failed check leaves the next
encrypt or decrypt due for another check: a process whose key is wrong keeps refusing, with the
same error, until it is restarted with the right key.

The check is one plan of statements (:meth:`KeyCheck._plan`), run the same whether the caller
is async (:meth:`KeyCheck.run`, what notifyq's own components await before they touch the
keyring) or sync (:meth:`KeyCheck.run_sync`, which the keyring's guard runs on a connection of
the synchronous pool when user code calls ``app.keyring.encrypt`` with the check due).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from notifyq._crypto.keyring import Keyring
from notifyq._db.queries import Queries
from notifyq._errors import ConfigError
from notifyq._keys.columns import EncryptedColumns

log = logging.getLogger("notifyq.keys")

Statement = tuple[str, dict[str, Any]]
Row = dict[str, Any]
Role = Literal["worker", "serve", "app"]
HOLDER_TTL_INTERVALS = 3
"""A holder row stays live three key-check intervals after its last check: one missed check
(a busy event loop, a database hiccup) does not drop a worker out of the count."""


@dataclass(frozen=True, slots=True)
class Step:
    """Statements the plan needs run; ``atomic``: in one transaction. The plan receives the
    last statement's rows."""

    statements: tuple[Statement, ...]
    atomic: bool = False
    check: Callable[[list[Row]], None] | None = None
    """Run on the last statement's rows before an atomic step commits: raising rolls it back."""


Plan = Generator[Step, list[Row], None]


@dataclass(slots=True)
class KeyHolder:
    """How this process appears in ``key_holder``: ``host:pid:token`` and its role (``worker``
    and ``serve`` are set by those commands; None: not recorded, a short-lived CLI command)."""

    id: str
    host: str
    pid: int
    role: Role | None = "app"

    @classmethod
    def of_this_process(cls) -> KeyHolder:
        host, pid = socket.gethostname(), os.getpid()
        return cls(f"{host}:{pid}:{secrets.token_hex(3)}", host, pid)


class KeyCheck:
    """Verifies one keyring against ``key_version``, follows the cluster's active version,
    records the process as a key holder and the registered columns.

    Example::

        check = KeyCheck(queries, keyring, columns, interval_s=10, monotonic=time.monotonic,
                         holder=KeyHolder.of_this_process(), wanted=2)
        if check.due():
            await check.run(conn)
    """

    def __init__(self, queries: Queries, keyring: Keyring, columns: EncryptedColumns, *,
                 interval_s: float, monotonic: Callable[[], float],
                 holder: KeyHolder | None = None, wanted: int | None = None) -> None:
        self._q = queries
        self.keyring = keyring
        self._columns = columns
        self._interval_s = interval_s
        self._monotonic = monotonic
        self.holder = holder
        self.wanted = wanted
        """``NOTIFYQ_ACTIVE_KEY_VERSION``: the first active version, and a request to promote
        it once every live process holds it (if it was never active)."""
        self._checked_at: float | None = None
        self._recorded: set[str] = set()
        self.recorded_holder = False
        """Whether a ``key_holder`` row was written (removed again at close)."""
        self._noted: tuple[str, ...] | None = None
        self._followed: tuple[int | None] | None = None
        self.lock = threading.Lock()
        """Held by the sync guard so that threads do not run the same check at once."""

    def due(self) -> bool:
        """Never checked, the last check failed, or ``interval_s`` passed since it succeeded."""
        checked = self._checked_at
        return checked is None or self._monotonic() - checked >= self._interval_s

    def expire(self) -> None:
        """Make the next encrypt or decrypt check first (a promotion was announced)."""
        self._checked_at = None

    async def run(self, conn: psycopg.AsyncConnection[Any]) -> Keyring:
        plan = self._plan()
        step = next(plan)
        while True:
            rows = await _run_async(conn, step)
            try:
                step = plan.send(rows)
            except StopIteration:
                return self.keyring

    def run_sync(self, conn: psycopg.Connection[Any]) -> Keyring:
        plan = self._plan()
        step = next(plan)
        while True:
            rows = _run_sync(conn, step)
            try:
                step = plan.send(rows)
            except StopIteration:
                return self.keyring

    def verify(self, rows: Sequence[Mapping[str, Any]]) -> Keyring:
        """Steps 2 and 3 (without promoting) against ``key_version_list`` rows the caller read,
        writing nothing and leaving the next encrypt or decrypt due for a full check (what
        read-only callers such as ``keys status`` use)."""
        self._verify(rows)
        active = _active_of(rows)
        if active is not None:
            self.keyring.set_active(active)
        return self.keyring

    # -- the plan ------------------------------------------------------------------------------

    def _plan(self) -> Plan:
        q = self._q
        rows = yield _one(q.key_version_list, {})
        self._verify(rows)  # a wrong known key is refused before anything is recorded
        insert = self._missing_versions(rows)
        if insert is not None:  # another process's may be recorded meanwhile: verify again
            rows = yield Step((insert, (q.key_version_list, {})), atomic=True,
                              check=self._verify)
        active = _active_of(rows)
        if self._asks_promotion(rows, active):
            outcome = (yield self._promotion())[0]
            if outcome["outcome"] == "promoted":
                counted = self.holder is not None and self.holder.role is not None
                log.log(logging.INFO if counted else logging.DEBUG,
                        "promoted key version %s for the cluster (NOTIFYQ_ACTIVE_KEY_VERSION; "
                        "was %s): every live process holds it", self.wanted,
                        outcome["previous"] or "none")
                active = self.wanted
            else:
                # The statement's own read of key_active, newer than the list's: a process that
                # started beside this one may have promoted the same version in between
                # ("unchanged"), and following the list's None would refuse every encrypt.
                active = outcome["previous"]
                self._note_refusal(outcome, active)
        self._follow(active)
        if self.holder is not None and self.holder.role is not None:
            yield _one(q.key_holder_record, self._holding())
            self.recorded_holder = True
        pending, record = self._unrecorded()
        if record is not None:
            yield _one(*record)
        self._succeeded(pending)

    def _asks_promotion(self, rows: Sequence[Mapping[str, Any]], active: int | None) -> bool:
        """Whether to promote NOTIFYQ_ACTIVE_KEY_VERSION: as the first active version, or, from
        a process counted among the key holders (not a CLI command), as a newer version than the
        active one that was never active before. Never backwards: an old deployment setting
        must not undo a promotion (an operator goes back with `notifyq keys promote`)."""
        wanted = self.wanted
        if wanted is None or wanted == active:
            return False
        if active is not None and (self.holder is None or self.holder.role is None
                                   or wanted < active):
            return False
        row = next((r for r in rows if r["version"] == wanted), None)
        return row is not None and row["retired_at"] is None and row["promoted_at"] is None

    def _promotion(self) -> Step:
        holder = self.holder
        who = f"{holder.role or 'process'} {holder.id}" if holder else "a process"
        return Step(((self._q.key_rotation_lock, {}), (self._q.key_active_promote, {
            "version": self.wanted, "force": False, "first_time": True, "now": None,
            "by": f"NOTIFYQ_ACTIVE_KEY_VERSION of {who}"[:300],
            "channel": self._q.schema})), atomic=True)

    def _note_refusal(self, outcome: Mapping[str, Any], active: int | None) -> None:
        """Once per reason: why NOTIFYQ_ACTIVE_KEY_VERSION was not promoted (yet)."""
        lacking = tuple(f"{p['role']} {p['id']}" for p in outcome["lacking"])
        reason = (outcome["outcome"], *lacking)
        if reason == self._noted or outcome["outcome"] == "unchanged":
            return
        self._noted = reason
        why = {"lacking": "processes that do not hold it yet: " + ", ".join(lacking),
               "rotating": "a rotation to another version is under way",
               "not_first": "it was active before (only `notifyq keys promote` goes back)"}
        log.warning("NOTIFYQ_ACTIVE_KEY_VERSION=%s is not promoted (%s); this process "
                    "encrypts under the cluster's active version %s until it is (`notifyq "
                    "keys promote %s` when every process holds it)", self.wanted,
                    why.get(outcome["outcome"], outcome["outcome"]), active or "(none yet)",
                    self.wanted)

    def _follow(self, active: int | None) -> None:
        """Take the cluster's active version. Logged when it changes, and at the first check
        when this process does not hold it."""
        keyring = self.keyring
        keyring.set_active(active)
        first, before = self._followed is None, self._followed
        self._followed = (active,)
        if active is None or (not first and before == (active,)):
            return
        if not keyring.holds(active):
            log.error("key version %s is active but this process does not hold it (it holds "
                      "%s): it decrypts what it can and encrypts nothing until version %s is "
                      "added to its NOTIFYQ_KEYS and it is restarted", active,
                      ", ".join(map(str, keyring.versions)), active)
        elif not first:
            log.info("key version %s is now active: new secrets are encrypted under it",
                     active)

    def _holding(self) -> dict[str, Any]:
        holder = self.holder
        assert holder is not None  # noqa: S101 - only called with a holder
        keyring = self.keyring
        checks = keyring.check_values()
        active = keyring.active_version
        usable = (active is not None and keyring.holds(active)
                  and active not in keyring.retired)
        return {"id": holder.id, "role": holder.role, "host": holder.host, "pid": holder.pid,
                "versions": list(checks), "check_values": list(checks.values()),
                "encrypts_with": active if usable else None, "interval_s": self._interval_s,
                "ttl_s": HOLDER_TTL_INTERVALS * self._interval_s, "now": None}

    # -- the pure parts ------------------------------------------------------------------------

    def _missing_versions(self, rows: Sequence[Mapping[str, Any]]) -> Statement | None:
        known = {r["version"] for r in rows}
        mine = {v: c for v, c in self.keyring.check_values().items() if v not in known}
        if not mine:
            return None
        return self._q.key_version_register, {"now": None, "versions": list(mine),
                                               "check_values": list(mine.values())}

    def _verify(self, rows: Sequence[Mapping[str, Any]]) -> None:
        checks = self.keyring.check_values()
        for row in rows:
            mine = checks.get(row["version"])
            if mine is not None and not hmac.compare_digest(mine, bytes(row["check_value"])):
                raise ConfigError(f"key version {row['version']} does not match the key that "
                                  "encrypted existing data: restore the original key for this "
                                  "version, or give the new key a new version number")
        self.keyring.set_retired(r["version"] for r in rows if r["retired_at"] is not None)

    def _unrecorded(self) -> tuple[set[str], Statement | None]:
        fresh = [c for c in self._columns.entries() if c[0].name not in self._recorded]
        if not fresh:
            return set(), None
        return {c.name for c, _ in fresh}, (self._q.encrypted_column_record, {
            "now": None, "tables": [c.table for c, _ in fresh],
            "columns": [c.column for c, _ in fresh], "pks": [c.pk for c, _ in fresh],
            "builtins": [builtin for _, builtin in fresh]})

    def _succeeded(self, recorded: set[str]) -> None:
        self._recorded |= recorded
        self._checked_at = self._monotonic()


def _active_of(rows: Sequence[Mapping[str, Any]]) -> int | None:
    return next((int(r["version"]) for r in rows if r["active"]), None)


def _one(query: str, params: dict[str, Any]) -> Step:
    return Step(((query, params),))


async def _run_async(conn: psycopg.AsyncConnection[Any], step: Step) -> list[Row]:
    if step.atomic:
        async with conn.transaction():
            rows = await _statements_async(conn, step)
            if step.check is not None:
                step.check(rows)
            return rows
    return await _statements_async(conn, step)


async def _statements_async(conn: psycopg.AsyncConnection[Any], step: Step) -> list[Row]:
    rows: list[Row] = []
    async with conn.cursor(row_factory=dict_row) as cur:
        for query, params in step.statements:
            await cur.execute(query, params)
            rows = await cur.fetchall() if cur.description else []
    return rows


def _run_sync(conn: psycopg.Connection[Any], step: Step) -> list[Row]:
    if step.atomic:
        with conn.transaction():
            rows = _statements_sync(conn, step)
            if step.check is not None:
                step.check(rows)
            return rows
    return _statements_sync(conn, step)


def _statements_sync(conn: psycopg.Connection[Any], step: Step) -> list[Row]:
    rows: list[Row] = []
    with conn.cursor(row_factory=dict_row) as cur:
        for query, params in step.statements:
            cur.execute(query, params)
            rows = cur.fetchall() if cur.description else []
    return rows
