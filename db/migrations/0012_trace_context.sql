-- OpenTelemetry (the `otel` extra): the W3C trace context of the enqueue that created a run
-- ({"traceparent": ..., "tracestate": ...}), which the handler's spans continue. NULL unless
-- the enqueuing process had a tracer provider installed; adding a nullable column without a
-- default rewrites nothing.
ALTER TABLE job_run ADD COLUMN trace_context jsonb;
