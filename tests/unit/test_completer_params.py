"""The completer's statement parameters: what job_run_finish_and_claim receives."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from psycopg_pool import AsyncConnectionPool

from notifyq import RunStatus
from notifyq._clock import SystemClock
from notifyq._db.queries import Queries
from notifyq._dispatch.completer import Completer, _Pending
from notifyq._dispatch.outcome import Outcome


@pytest.fixture
def completer() -> Iterator[Completer]:
    no_pool = cast(AsyncConnectionPool[Any], None)  # _params never touches the database
    made = Completer(no_pool, Queries("notifyq"), SystemClock(), worker_id="w")
    yield made
    made.close()
    made._receive.close()


def test_a_cycle_with_nothing_to_write_has_null_ids_so_a_claim_goes_alone(
        completer: Completer) -> None:
    params = completer._params([])
    assert params["ids"] is None  # _statement: job_run_claim, or no statement at all


def test_write_backs_go_in_id_order_as_array_literals_and_all_null_columns_as_null(
        completer: Completer) -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    writes = [_Pending(ids[0], -7, Outcome(RunStatus.COMPLETED), lambda ok, exc: None),
              _Pending(ids[1], 5, Outcome(RunStatus.COMPLETED, output='{"a":1}'),
                       lambda ok, exc: None),
              _Pending(ids[2], 9, Outcome(RunStatus.PENDING, refund=1), lambda ok, exc: None)]
    params = completer._params(writes)
    by_id = sorted(zip(ids, writes, strict=True))
    assert params["ids"] == "{" + ",".join(str(i) for i, _ in by_id) + "}"
    assert params["fences"] == "{" + ",".join(str(w.fence) for _, w in by_id) + "}"
    assert params["statuses"] == "{" + ",".join(w.outcome.status.value for _, w in by_id) + "}"
    assert params["refunds"] == "{" + ",".join(str(w.outcome.refund) for _, w in by_id) + "}"
    assert params["outputs"] == [w.outcome.output for _, w in by_id]
    assert params["errors"] is None
    assert params["wait_kinds"] is None
