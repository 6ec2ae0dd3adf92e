-- The dashboard's 10-million-run table (bench/dashboard.py loads it into a scratch database), and
-- bench/history.py's finished runs. psql variables: `runs` (how many; 60.48 ms apart, so 10
-- million span 7 days), `live` (how many of the newest are pending, running or waiting: 50000
-- for the dashboard, 0 for history: every other run is finished), `before` (an interval: the
-- newest run's age; history loads each increment before the runs already there).
-- Ids are UUIDv7 of created_at.
SET maintenance_work_mem = '1GB';
CREATE TEMP TABLE saved_indexes AS
  SELECT indexname, indexdef FROM pg_indexes
  WHERE schemaname = 'notifyq' AND tablename = 'job_run' AND indexname <> 'job_run_pkey';
DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT indexname FROM saved_indexes LOOP EXECUTE 'DROP INDEX notifyq.' || quote_ident(r.indexname); END LOOP;
END $$;
ALTER TABLE notifyq.job_run DISABLE TRIGGER ALL;
INSERT INTO notifyq.job_run (id, job_type, status, input, output, error, pool, priority, run_at,
    attempts, max_attempts, tags, tenant_id, scope_entity_type, scope_entity_id, started_at,
    finished_at, created_at, updated_at, claimed_at)
SELECT
  encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
      PLACING substring(int8send((extract(epoch FROM c) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid,
  'type.' || (g % 20), s, jsonb_build_object('n', g),
  CASE WHEN s = 'completed' THEN '{"ok": true}'::jsonb END,
  CASE WHEN s IN ('failed', 'timed_out') THEN '{"message": "boom", "type": "ValueError", "attempt": 3}'::jsonb END,
  (ARRAY['default', 'default', 'default', 'emails', 'webhooks', 'reports'])[1 + g % 6],
  0,
  CASE WHEN s = 'pending' AND g % 100 = 0 THEN now() + interval '1 hour'
       WHEN s = 'waiting' THEN 'infinity'::timestamptz ELSE c END,
  CASE WHEN s IN ('pending') THEN 0 WHEN s IN ('failed', 'timed_out') THEN 3 ELSE 1 END, 25,
  CASE WHEN g % 1000 = 0 THEN ARRAY['rare'] WHEN g % 3 = 0 THEN ARRAY['blue'] ELSE ARRAY[]::text[] END,
  't' || (g % 1000),
  CASE WHEN g % 10 = 0 THEN 'order' END, CASE WHEN g % 10 = 0 THEN 'o' || g END,
  CASE WHEN s NOT IN ('pending') THEN c + interval '50 ms' END,
  CASE WHEN s IN ('completed', 'failed', 'timed_out', 'canceled') THEN c + interval '2 s' END,
  c, c, CASE WHEN s NOT IN ('pending') THEN c + interval '50 ms' END
FROM (
  SELECT g, now() - :'before'::interval - (:runs - g) * interval '60.48 ms' AS c,
    CASE WHEN g > :runs - :live AND g % 50 = 0 THEN 'running'
         WHEN g > :runs - :live AND g % 9 = 0 THEN 'waiting'
         WHEN g > :runs - :live THEN 'pending'
         WHEN g % 33 = 0 THEN 'failed'
         WHEN g % 101 = 0 THEN 'canceled'
         WHEN g % 199 = 0 THEN 'timed_out'
         ELSE 'completed' END AS s
  FROM generate_series(1, :runs) g
) x;
ALTER TABLE notifyq.job_run ENABLE TRIGGER ALL;
UPDATE notifyq.job_run SET run_at = '2999-12-31'::timestamptz, wait_kind = 'signal', wait_token = 'tok-' || id
  WHERE status = 'waiting';
DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT indexdef FROM saved_indexes LOOP EXECUTE r.indexdef; END LOOP;
END $$;
VACUUM ANALYZE notifyq.job_run;
SELECT status, count(*) FROM notifyq.job_run GROUP BY status ORDER BY 1;
SELECT pg_size_pretty(pg_total_relation_size('notifyq.job_run'));
