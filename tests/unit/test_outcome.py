"""decide(): what each handler result becomes, with no I/O."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from notifyq import Permanent, RetryPolicy, RunStatus, Snooze
from notifyq._dispatch.outcome import (
    Canceled,
    Outcome,
    Raised,
    Released,
    Succeeded,
    TimedOut,
    decide,
)
from notifyq._run import RunInfo

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
NO_JITTER = RetryPolicy(attempts=5, backoff="exponential", base_s=2, max_s=100, jitter=0)


def run_info(attempt: int = 1, max_attempts: int = 5) -> RunInfo:
    return RunInfo(id=uuid.uuid4(), job_type="t.x", attempt=attempt, max_attempts=max_attempts,
                   pool="default", priority=0, run_at=NOW, created_at=NOW, tags=[])


def outcome_of(result: object, *, attempt: int = 1, max_attempts: int = 5,
               policy: RetryPolicy = NO_JITTER) -> Outcome:
    return decide(run_info(attempt, max_attempts), result, policy, NOW,  # type: ignore[arg-type]
                  random.Random(1))


def test_success_completes_with_the_output_as_json() -> None:
    out = outcome_of(Succeeded({"sent": True, "n": [1, 2]}))
    assert out.status is RunStatus.COMPLETED
    assert json.loads(out.output or "") == {"sent": True, "n": [1, 2]}
    assert out.error is None
    assert out.refund == 0


def test_success_with_none_output_stores_no_output() -> None:
    out = outcome_of(Succeeded(None))
    assert out.status is RunStatus.COMPLETED
    assert out.output is None


def test_non_json_output_is_refused_with_a_type_error() -> None:
    with pytest.raises(TypeError, match="not JSON-serializable"):
        outcome_of(Succeeded({"when": object()}))
    with pytest.raises(TypeError, match="not JSON-serializable"):
        outcome_of(Succeeded({"x": float("nan")}))


def test_output_with_a_nul_character_is_refused_like_input() -> None:
    with pytest.raises(TypeError, match="NUL"):
        outcome_of(Succeeded({"x": "a\x00b"}))


def test_error_with_attempts_left_retries_after_the_backoff() -> None:
    out = outcome_of(Raised(ValueError("boom")), attempt=3)
    assert out.status is RunStatus.PENDING
    assert out.run_at == NOW + timedelta(seconds=8)  # 2 * 2 ** (3 - 1)
    assert out.refund == 0
    error = json.loads(out.error or "")
    assert error["message"] == "boom"
    assert error["type"] == "builtins.ValueError"
    assert error["retryable"] is True
    assert error["attempt"] == 3
    assert "ValueError: boom" in error["stack"]
    assert out.kind == "retried"


def test_error_on_the_last_attempt_fails_the_run() -> None:
    out = outcome_of(Raised(ValueError("boom")), attempt=5, max_attempts=5)
    assert out.status is RunStatus.FAILED
    assert out.run_at is None
    error = json.loads(out.error or "")
    assert error["retryable"] is False
    assert error["attempt"] == 5


def test_permanent_fails_at_once_with_the_wrapped_error() -> None:
    out = outcome_of(Raised(Permanent(LookupError("no such customer"))), attempt=1)
    assert out.status is RunStatus.FAILED
    error = json.loads(out.error or "")
    assert error["type"] == "builtins.LookupError"
    assert error["message"] == "no such customer"
    assert error["retryable"] is False
    assert error["attempt"] == 1


def test_permanent_given_a_string_wraps_it_in_a_value_error() -> None:
    out = outcome_of(Raised(Permanent("bad address")))
    assert out.status is RunStatus.FAILED
    assert json.loads(out.error or "")["type"] == "builtins.ValueError"


def test_non_retryable_error_type_fails_at_once() -> None:
    policy = RetryPolicy(attempts=5, jitter=0, non_retryable=(KeyError,))
    out = outcome_of(Raised(KeyError("k")), attempt=1, policy=policy)
    assert out.status is RunStatus.FAILED
    assert json.loads(out.error or "")["retryable"] is False
    retried = outcome_of(Raised(ValueError("v")), attempt=1, policy=policy)
    assert retried.status is RunStatus.PENDING


def test_snooze_runs_later_and_refunds_the_attempt() -> None:
    out = outcome_of(Raised(Snooze(30)), attempt=5, max_attempts=5)
    assert out.status is RunStatus.PENDING
    assert out.run_at == NOW + timedelta(seconds=30)
    assert out.refund == 1
    assert out.error is None
    assert out.kind == "snoozed"


def test_snooze_refuses_negative_seconds() -> None:
    with pytest.raises(ValueError, match="negative"):
        Snooze(-1)


def test_timeout_with_attempts_left_is_retried() -> None:
    out = outcome_of(TimedOut(1.5), attempt=1)
    assert out.status is RunStatus.PENDING
    assert out.run_at == NOW + timedelta(seconds=2)
    error = json.loads(out.error or "")
    assert error == {"message": "timed out after 1.5 s", "type": "TimeoutError",
                     "retryable": True, "attempt": 1}


def test_timeout_on_the_last_attempt_is_timed_out() -> None:
    out = outcome_of(TimedOut(1.5), attempt=5, max_attempts=5)
    assert out.status is RunStatus.TIMED_OUT
    assert json.loads(out.error or "")["retryable"] is False


def test_canceled_is_terminal_with_a_canceled_error() -> None:
    out = outcome_of(Canceled(), attempt=2)
    assert out.status is RunStatus.CANCELED
    assert json.loads(out.error or "") == {"message": "canceled while running",
                                           "type": "Canceled", "retryable": False, "attempt": 2}
    assert out.kind == "canceled"


def test_released_goes_back_now_without_counting_the_attempt() -> None:
    out = outcome_of(Released(), attempt=5, max_attempts=5)
    assert out.status is RunStatus.PENDING
    assert out.run_at == NOW
    assert out.refund == 1
    assert out.error is None
    assert out.kind == "released"


def test_error_message_and_stack_are_truncated() -> None:
    out = outcome_of(Raised(ValueError("x" * 10_000)))
    error = json.loads(out.error or "")
    assert len(error["message"]) == 2_000
    assert len(error["stack"]) <= 8_000


def test_error_with_an_empty_message_uses_the_type_name() -> None:
    error = json.loads(outcome_of(Raised(RuntimeError())).error or "")
    assert error["message"] == "RuntimeError"


def test_error_with_a_nul_character_is_stored_without_it() -> None:
    error_text = outcome_of(Raised(ValueError("bad\x00byte"))).error or ""
    assert "\\u0000" not in error_text
    assert json.loads(error_text)["message"] == "bad\ufffdbyte"


def test_output_with_an_unpaired_surrogate_is_refused() -> None:
    with pytest.raises(TypeError, match="unpaired surrogate"):
        outcome_of(Succeeded({"x": "a\ud800"}))


def test_non_ascii_output_is_kept_as_is() -> None:
    out = outcome_of(Succeeded({"x": "héllo 😀"}))
    assert json.loads(out.output or "") == {"x": "héllo 😀"}


def test_error_with_an_unpaired_surrogate_is_stored_without_it() -> None:
    error_text = outcome_of(Raised(ValueError("bad\udc80byte"))).error or ""
    assert json.loads(error_text)["message"] == "bad?byte"
    error_text.encode()
