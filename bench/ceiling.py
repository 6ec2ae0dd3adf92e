#!/usr/bin/env python3
"""Pure-SQL ceilings of the hot-path designs weighed in db/README.md.

No queue library and no Python per run: pgbench (C) sends one statement per cycle that writes
back the previous batch and claims the next, the shape of notifyq's worker statement, on a
freshly migrated notifyq database per design. What it measures is PostgreSQL's cost per run
for each table layout, at batch 10 and 100.

    bench/ceiling.py                      # every design, batch 10 and 100 (~6 min)
    bench/ceiling.py --design wide --design narrow-delete --seconds 5 --clients 2
    bench/ceiling.py --design wide --design bare --clients 1 --enqueue-only   # one enqueuer

Designs (each a fresh database, `nqceil_<design>`, dropped afterwards):

- ``wide``: today's layout. Claim and finish each rewrite the 39-column ``job_run`` row.
- ``narrow-keep``: a narrow ``job_queue`` row (what claiming, leasing and fencing need) beside the
  durable record. Claim touches only the narrow row (the record's input is read by primary
  key); finish marks the narrow row done and writes status/output/attempts into the record.
- ``narrow-delete``: the same, but finish deletes the narrow row (the hot table only ever holds
  pending and running runs).
- ``narrow-log``: finish deletes the narrow row and appends a result row; the record is never
  updated on the hot path (readers would join three tables).
- ``wide-async``: ``wide`` with ``synchronous_commit = off`` for the whole cycle: what the
  commit's WAL flush costs (not a design: write-backs must stay synchronous).
- ``bare``: no durable record at all, a peer's shape (pgqueuer): the queue row carries the
  payload, finish deletes it and appends a log row. The floor for any design here.

Also per design: enqueue of one run per transaction (4 clients) and of 1,000 per statement.
Prints a Markdown table; ``--json`` for the raw figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADMIN = os.environ.get("NOTIFYQ_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DESIGNS = ("wide", "wide-async", "narrow-keep", "narrow-delete", "narrow-log", "bare")

# The claim-side indexes of job_run that a narrow design moves to job_queue.
MOVED_INDEXES = ("job_run_claim_idx", "job_run_claim_fair_idx", "job_run_claim_keyed_idx",
                 "job_run_claim_rated_idx", "job_run_running_idx", "job_run_scheduled_idx")

NARROW_DDL = """
CREATE TABLE notifyq.job_queue (
    id uuid PRIMARY KEY,
    pool text NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    state "char" NOT NULL DEFAULT 'p',
    attempts integer NOT NULL DEFAULT 0,
    fence bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    leased_by text,
    concurrency_key text,
    payload jsonb
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 1);
CREATE INDEX job_queue_claim_idx ON notifyq.job_queue (pool, priority, run_at, id)
    WHERE state = 'p' AND concurrency_key IS NULL;
CREATE INDEX job_queue_lease_idx ON notifyq.job_queue (lease_expires_at) WHERE state = 'r';
CREATE TABLE notifyq.job_result (
    id uuid PRIMARY KEY, status text NOT NULL, output jsonb, error jsonb,
    attempts integer NOT NULL, finished_at timestamptz NOT NULL
);
"""

# One cycle per transaction: write back the batch claimed by the previous cycle, claim the
# next. :ids/:fences come from the previous cycle's \gset ('{}' on the first).
CYCLE = {
    "wide": """
WITH fin AS (
    UPDATE notifyq.job_run r
    SET status = 'completed', output = '{"ok": true}', finished_at = now(),
        leased_by = NULL, lease_expires_at = NULL, updated_at = now()
    FROM unnest(':ids'::uuid[], ':fences'::bigint[]) v(id, fence)
    WHERE r.id = v.id AND r.fence = v.fence AND r.status = 'running'
    RETURNING r.id
), picked AS (
    SELECT id FROM notifyq.job_run
    WHERE status = 'pending' AND pool = 'default' AND run_at <= now()
      AND concurrency_key IS NULL AND rate_key IS NULL
    ORDER BY priority, run_at, id LIMIT {batch} FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE notifyq.job_run r
    SET status = 'running', attempts = r.attempts + 1, fence = r.fence + 1, claimed_at = now(),
        started_at = coalesce(r.started_at, now()), leased_by = 'w:1',
        lease_expires_at = now() + interval '30 s', updated_at = now()
    FROM picked WHERE r.id = picked.id
    RETURNING r.id, r.fence, r.input, r.job_type, r.attempts, r.max_attempts, r.tags
)
SELECT coalesce(array_agg(id), '{}')::text AS ids, coalesce(array_agg(fence), '{}')::text AS fences,
       sum(length(input::text) + length(job_type)) AS bytes, (SELECT count(*) FROM fin) AS done
FROM claimed
""",
    "narrow-keep": """
WITH fin AS (
    UPDATE notifyq.job_queue q SET state = 'd', leased_by = NULL, lease_expires_at = NULL
    FROM unnest(':ids'::uuid[], ':fences'::bigint[]) v(id, fence)
    WHERE q.id = v.id AND q.fence = v.fence AND q.state = 'r'
    RETURNING q.id, q.attempts
), rec AS (
    UPDATE notifyq.job_run r
    SET status = 'completed', output = '{"ok": true}', attempts = fin.attempts,
        finished_at = now(), updated_at = now()
    FROM fin WHERE r.id = fin.id RETURNING r.id
), {claim}
""",
    "narrow-delete": """
WITH fin AS (
    DELETE FROM notifyq.job_queue q
    USING unnest(':ids'::uuid[], ':fences'::bigint[]) v(id, fence)
    WHERE q.id = v.id AND q.fence = v.fence AND q.state = 'r'
    RETURNING q.id, q.attempts
), rec AS (
    UPDATE notifyq.job_run r
    SET status = 'completed', output = '{"ok": true}', attempts = fin.attempts,
        finished_at = now(), updated_at = now()
    FROM fin WHERE r.id = fin.id RETURNING r.id
), {claim}
""",
    "narrow-log": """
WITH fin AS (
    DELETE FROM notifyq.job_queue q
    USING unnest(':ids'::uuid[], ':fences'::bigint[]) v(id, fence)
    WHERE q.id = v.id AND q.fence = v.fence AND q.state = 'r'
    RETURNING q.id, q.attempts
), rec AS (
    INSERT INTO notifyq.job_result (id, status, output, attempts, finished_at)
    SELECT id, 'completed', '{"ok": true}', attempts, now() FROM fin RETURNING id
), {claim}
""",
}

CYCLE["wide-async"] = CYCLE["wide"]
CYCLE["bare"] = """
WITH fin AS (
    DELETE FROM notifyq.job_queue q
    USING unnest(':ids'::uuid[], ':fences'::bigint[]) v(id, fence)
    WHERE q.id = v.id AND q.fence = v.fence AND q.state = 'r'
    RETURNING q.id, q.attempts
), rec AS (
    INSERT INTO notifyq.job_result (id, status, attempts, finished_at)
    SELECT id, 'completed', attempts, now() FROM fin RETURNING id
), picked AS (
    SELECT id FROM notifyq.job_queue
    WHERE state = 'p' AND pool = 'default' AND run_at <= now() AND concurrency_key IS NULL
    ORDER BY priority, run_at, id LIMIT {batch} FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE notifyq.job_queue q
    SET state = 'r', attempts = q.attempts + 1, fence = q.fence + 1, leased_by = 'w:1',
        lease_expires_at = now() + interval '30 s'
    FROM picked WHERE q.id = picked.id
    RETURNING q.id, q.fence, q.payload
)
SELECT coalesce(array_agg(c.id), '{}')::text AS ids,
       coalesce(array_agg(c.fence), '{}')::text AS fences,
       sum(length(c.payload::text)) AS bytes, (SELECT count(*) FROM rec) AS done
FROM claimed c
"""

NARROW_CLAIM = """picked AS (
    SELECT id FROM notifyq.job_queue
    WHERE state = 'p' AND pool = 'default' AND run_at <= now() AND concurrency_key IS NULL
    ORDER BY priority, run_at, id LIMIT {batch} FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE notifyq.job_queue q
    SET state = 'r', attempts = q.attempts + 1, fence = q.fence + 1, leased_by = 'w:1',
        lease_expires_at = now() + interval '30 s'
    FROM picked WHERE q.id = picked.id
    RETURNING q.id, q.fence, q.attempts
)
SELECT coalesce(array_agg(c.id), '{}')::text AS ids,
       coalesce(array_agg(c.fence), '{}')::text AS fences,
       sum(length(r.input::text) + length(r.job_type)) AS bytes,
       (SELECT count(*) FROM rec) AS done
FROM claimed c JOIN notifyq.job_run r ON r.id = c.id
"""

ENQUEUE_WIDE = """
INSERT INTO notifyq.job_run (job_type, input, pool)
SELECT 'noop', '{"n": 1}', 'default' FROM generate_series(1, {rows})
"""
ENQUEUE_BARE = """
INSERT INTO notifyq.job_queue (id, pool, payload)
SELECT gen_random_uuid(), 'default', '{"n": 1}' FROM generate_series(1, {rows})
"""
ENQUEUE_NARROW = """
WITH r AS (
    INSERT INTO notifyq.job_run (job_type, input, pool)
    SELECT 'noop', '{"n": 1}', 'default' FROM generate_series(1, {rows})
    RETURNING id, pool, priority, run_at
)
INSERT INTO notifyq.job_queue (id, pool, priority, run_at) SELECT id, pool, priority, run_at FROM r
"""


def psql(dsn: str, sql: str) -> str:
    out = subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", dsn, "-c", sql],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def with_db(dsn: str, db: str) -> str:
    return re.sub(r"/[^/?]*(\?|$)", f"/{db}\\1", dsn, count=1)


def pgbench() -> str:
    found = shutil.which("pgbench")
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True):
        return str(candidate)
    sys.exit("pgbench not found (Debian: postgresql-client or the server package)")


def fresh(design: str) -> str:
    db = f"nqceil_{design.replace('-', '_')}"
    psql(ADMIN, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    psql(ADMIN, f"CREATE DATABASE {db}")
    dsn = with_db(ADMIN, db)
    subprocess.run([sys.executable, "-m", "notifyq", "migrate"], check=True, capture_output=True,
                   cwd=ROOT, env={**os.environ, "NOTIFYQ_DATABASE_URL": dsn})
    psql(dsn, "INSERT INTO notifyq.job (type) VALUES ('noop') ON CONFLICT DO NOTHING")
    if not design.startswith("wide"):
        psql(dsn, NARROW_DDL + "".join(f"DROP INDEX notifyq.{i};" for i in MOVED_INDEXES))
    return dsn


def run_pgbench(dsn: str, script: str, clients: int, seconds: float, *,
                defines: dict[str, str] | None = None, options: str = "") -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    try:
        cmd = [pgbench(), "-n", "-M", "prepared" if ":ids" not in script else "simple",
               "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(int(seconds)),
               "-f", f.name, dsn]
        for k, v in (defines or {}).items():
            cmd[1:1] = ["-D", f"{k}={v}"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                             env={**os.environ, "PGOPTIONS": options}).stdout
    finally:
        os.unlink(f.name)
    match = re.search(r"tps = ([\d.]+) \(without initial", out)
    if not match:
        raise RuntimeError(out)
    return float(match.group(1))


def server_cpu_s(dsn: str) -> float:
    """CPU of the whole PostgreSQL server, exited backends included (the postmaster's
    children times): this bench is its only client."""
    total = 0
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            if (pid_dir / "comm").read_text().strip() not in ("postgres", "postmaster"):
                continue
            fields = (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def measure(design: str, batch: int, clients: int, seconds: float) -> dict[str, float]:
    dsn = fresh(design)
    insert = _insert(design)
    # Enough for the run never to drain the queue: the fastest design here does < 60k/s.
    total = int(max(60_000 * seconds, 20_000))
    for _ in range(total // 50_000 + 1):
        psql(dsn, insert.replace("{rows}", "50000"))
    psql(dsn, "VACUUM ANALYZE")
    cycle = CYCLE[design].replace("{claim}", NARROW_CLAIM).replace("{batch}", str(batch))
    script = cycle.strip() + " \\gset\n"
    options = "-c synchronous_commit=off" if design == "wide-async" else ""
    empty = {"ids": "{}", "fences": "{}"}
    run_pgbench(dsn, script, clients, 2, defines=empty, options=options)  # warm-up
    cpu0 = server_cpu_s(dsn)
    tps = run_pgbench(dsn, script, clients, seconds, defines=empty, options=options)
    cpu = server_cpu_s(dsn) - cpu0
    table = ("job_run WHERE status = 'pending'" if design.startswith("wide")
             else "job_queue WHERE state = 'p'")
    left = int(psql(dsn, f"SELECT count(*) FROM notifyq.{table}"))
    runs_per_s = tps * batch
    return {"runs_per_s": runs_per_s, "server_us_per_run": cpu / (runs_per_s * seconds) * 1e6,
            "left": left}


def _insert(design: str) -> str:
    return {"bare": ENQUEUE_BARE}.get(design, ENQUEUE_WIDE if design.startswith("wide")
                                       else ENQUEUE_NARROW)


def enqueue(design: str, clients: int, seconds: float) -> dict[str, float]:
    dsn = fresh(design)
    insert = _insert(design)
    single = run_pgbench(dsn, insert.replace("{rows}", "1").strip() + ";\n", clients, seconds)
    bulk = run_pgbench(dsn, insert.replace("{rows}", "1000").strip() + ";\n", clients, seconds)
    return {"single_per_s": single, "bulk_rows_per_s": bulk * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--design", action="append", choices=DESIGNS)
    parser.add_argument("--batch", action="append", type=int)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--enqueue-only", action="store_true",
                        help="only the enqueue cells (with --clients 1: one enqueuer's floor)")
    args = parser.parse_args()
    designs = args.design or list(DESIGNS)
    batches = [] if args.enqueue_only else args.batch or [10, 100]
    report: dict[str, dict[str, object]] = {}
    for design in designs:
        row: dict[str, object] = {}
        for batch in batches:
            row[f"batch_{batch}"] = measure(design, batch, args.clients, args.seconds)
        row["enqueue"] = enqueue(design, args.clients, args.seconds / 2)
        report[design] = row
        with contextlib.suppress(subprocess.CalledProcessError):
            psql(ADMIN, f"DROP DATABASE IF EXISTS nqceil_{design.replace('-', '_')} WITH (FORCE)")
        print(f"{design}: {json.dumps(row)}", file=sys.stderr)
    if args.json:
        print(json.dumps({"load_average_end": os.getloadavg(), "clients": args.clients,
                          "seconds": args.seconds, "designs": report}, indent=2))
        return 0
    head = "".join(f" claim+finish, batch {b} |" for b in batches)
    print(f"| design |{head} enqueue 1/tx | enqueue 1,000/stmt |")
    print("|---" * (len(batches) + 3) + "|")
    for design, row in report.items():
        cells = []
        for b in batches:
            m = row[f"batch_{b}"]
            assert isinstance(m, dict)
            cells.append(f"{m['runs_per_s']:,.0f}/s ({m['server_us_per_run']:.0f} µs)")
        e = row["enqueue"]
        assert isinstance(e, dict)
        print(f"| {design} |" + "".join(f" {c} |" for c in cells)
              + f" {e['single_per_s']:,.0f}/s | {e['bulk_rows_per_s']:,.0f}/s |")
    print(f"\n{args.clients} pgbench clients, {args.seconds:g} s per cell, load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
