"""What the webhook commands and routes say happened, with a real ``notifyq serve`` (worker and
API over real HTTP), the real CLI and a real receiver: delivery attempts against the schedule
(not the run's own counter), manual resends numbered on their own, and one line for every
command that changes something."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests import vault
from tests.integration.serving import Served
from tests.receiver import Receiver, Reply
from tests.support import ROOT, wait_until

KEYS = {"NOTIFYQ_KEYS": f"1:{vault.b64(vault.KEY1)}", "NOTIFYQ_ACTIVE_KEY_VERSION": "1",
        "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8,::1/128"}
# Two attempts at once, the third (the last) 10 minutes later: the test looks in between.
SCHEDULE = {"NOTIFYQ_WEBHOOKS__RETRY_SCHEDULE_S": "[0, 0.2, 600]"}


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")},
           "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_LOG_LEVEL": "WARNING", **KEYS, **SCHEDULE}
    result = subprocess.run([sys.executable, "-m", "notifyq", *args], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result


def _tries(dsn: str, run_id: str) -> str:
    """The TRIES cell of ``notifyq runs list`` for one run."""
    for line in _cli(dsn, "runs", "list").stdout.splitlines():
        if line.startswith(run_id):
            return line.split()[5]
    raise AssertionError(f"run {run_id} is not listed")


def test_a_failing_delivery_counts_its_attempts_against_the_schedule_and_a_resend_is_manual_1(
        dsn: str, receiver: Receiver, tmp_path: Path) -> None:
    receiver.script("/hook", Reply(status=500), Reply(status=500))  # then 200
    endpoint = json.loads(_cli(dsn, "webhooks", "endpoints", "add", receiver.url(),
                               "--json").stdout)
    message_id = _cli(dsn, "webhooks", "send", "order.paid", "--payload", '{"n": 1}'
                      ).stdout.strip()
    with Served(dsn, tmp_path / "serve.log", env={**KEYS, **SCHEDULE}) as served, \
            served.client() as api:
        def delivery() -> dict[str, Any]:
            message = api.get(f"/v1/webhooks/messages/{message_id}")
            assert message.status_code == 200, message.text
            [only] = message.json()["deliveries"]
            assert only["attempts"] == 2, only
            return dict(only)
        scheduled = wait_until(delivery, timeout=30)
        # Two attempts made of the schedule's three: not the run's own 0/100.
        assert _tries(dsn, scheduled["run_id"]) == "2/3"
        assert (scheduled["status"], scheduled.get("max_attempts")) == ("pending", 3)
        before = _cli(dsn, "webhooks", "attempts", message_id).stdout.strip().split("\n\n")[-1]
        assert re.fullmatch(
            f"endpoint {endpoint['id']}: pending after 2 of 3 scheduled attempts, next at "
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", before), before

        resent = _cli(dsn, "webhooks", "resend", message_id)
        manual_run = resent.stdout.strip()

        def three_attempts() -> list[dict[str, Any]]:
            answer = api.get(f"/v1/webhooks/messages/{message_id}/attempts")
            assert answer.status_code == 200, answer.text
            items = answer.json()["items"]
            assert len(items) == 3, items
            return list(items)
        items = wait_until(three_attempts, timeout=30)
    assert [(a["trigger"], a["attempt"], a["max_attempts"], a["status_code"]) for a in items] == [
        ("scheduled", 1, 3, 500), ("scheduled", 2, 3, 500), ("manual", 1, None, 200)]
    assert items[2]["run_id"] == manual_run
    assert _tries(dsn, manual_run) == "1/1"
    assert _tries(dsn, scheduled["run_id"]) == "2/3"

    listed = json.loads(_cli(dsn, "webhooks", "attempts", message_id, "--json").stdout)
    assert [(a["trigger"], a["attempt"], a["max_attempts"]) for a in listed] == [
        (a["trigger"], a["attempt"], a["max_attempts"]) for a in items]
    text = _cli(dsn, "webhooks", "attempts", message_id).stdout
    table, summary = text.strip().split("\n\n")
    assert [line.split()[2:5] for line in table.splitlines()[1:]] == [
        ["scheduled", "1/3", "500"], ["scheduled", "2/3", "500"], ["manual", "1", "200"]]
    # The manual resend succeeded, and a success ends the delivery.
    assert summary == (f"endpoint {endpoint['id']}: succeeded after 2 of 3 scheduled attempts, "
                       "and 1 manual resend")


def test_every_webhooks_command_that_changes_something_says_what_it_did_in_one_line(
        dsn: str, receiver: Receiver) -> None:
    added = _cli(dsn, "webhooks", "endpoints", "add", receiver.url(), "--event-type", "a.b")
    endpoint_id = added.stdout.strip()
    assert added.stdout == f"{endpoint_id}\n"  # alone: ID=$(notifyq webhooks endpoints add ...)
    said, secret = added.stderr.splitlines()
    assert said == f"created endpoint {endpoint_id} for {receiver.url()} (event types a.b, enabled)"
    assert secret.startswith("secret (shown once, store it now): whsec_")

    disabled = _cli(dsn, "webhooks", "endpoints", "disable", endpoint_id, "--reason", "upgrade")
    assert disabled.stdout == (f"disabled endpoint {endpoint_id} ({receiver.url()}): upgrade; "
                               "its pending deliveries are canceled\n")
    enabled = _cli(dsn, "webhooks", "endpoints", "enable", endpoint_id)
    assert enabled.stdout == (f"enabled endpoint {endpoint_id} ({receiver.url()}): new messages "
                              "go to it again and its failure streak starts from zero\n")
    rotated = _cli(dsn, "webhooks", "endpoints", "rotate-secret", endpoint_id, "--grace-s", "60")
    said, new_secret = rotated.stdout.splitlines()
    assert said == (f"rotated the signing secret of endpoint {endpoint_id}: the previous one "
                    "keeps signing for 60 s")
    assert new_secret.startswith("new secret (shown once, store it now): whsec_")

    sent = _cli(dsn, "webhooks", "send", "a.b", "--payload", "{}", "--idempotency-key", "k1")
    message_id = sent.stdout.strip()  # stdout stays the id, for scripts
    assert re.fullmatch(r"msg_[0-9a-f]{32}", message_id)
    assert sent.stderr == f"sent message {message_id} (a.b) to 1 endpoint\n"
    again = _cli(dsn, "webhooks", "send", "a.b", "--payload", "{}", "--idempotency-key", "k1")
    assert again.stdout.strip() == message_id
    assert again.stderr == (f"the idempotency key matched message {message_id}, sent earlier "
                            "to 1 endpoint: nothing new was sent\n")
    nobody = _cli(dsn, "webhooks", "send", "c.d", "--payload", "{}")
    assert nobody.stderr == (f"stored message {nobody.stdout.strip()}, but no enabled endpoint "
                             "subscribes to c.d: nothing will be delivered\n")

    resent = _cli(dsn, "webhooks", "resend", message_id)
    assert re.fullmatch(r"[0-9a-f-]{36}\n", resent.stdout)
    assert resent.stderr == (f"resending message {message_id} to 1 endpoint: one manual attempt "
                             "each, no retries (see `notifyq webhooks attempts "
                             f"{message_id}`)\n")
    recovered = _cli(dsn, "webhooks", "recover", endpoint_id, "--since", "2020-01-01T00:00Z")
    assert recovered.stdout == (f"no failed delivery of endpoint {endpoint_id} last attempted "
                                "since 2020-01-01T00:00:00+00:00: nothing to recover\n")
