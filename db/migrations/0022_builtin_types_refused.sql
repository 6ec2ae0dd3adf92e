-- notifyq's own job types (`webhook.deliver`, `secret.reencrypt`) are enqueued by their features
-- only: webhooks' send, resend and recover (through `_enqueue` and `_send_webhook`) and key
-- rotation (KeyAdmin.rotate, which registers the run in key_rotation in the same transaction).
-- Through the public `enqueue` an application could ask for either directly: a webhook.deliver
-- with another tenant's message and endpoint ids resent that tenant's message, and a
-- secret.reencrypt started a cluster-wide re-encryption that the rotate-key route refuses a
-- tenant's token (issue 31, item 2). `enqueue` now refuses them with 22023 (InvalidEnqueue in
-- Python), naming where to ask instead; notifyq._limits.BUILTIN_JOB_TYPES is the same list.
--
-- 0007's `enqueue`, same signature and parameter names, in plpgsql for the RAISE.
CREATE OR REPLACE FUNCTION enqueue(
    job_type           text,
    input              jsonb,
    run_at             timestamptz DEFAULT NULL,
    priority           integer DEFAULT NULL,
    pool               text DEFAULT NULL,
    max_attempts       integer DEFAULT NULL,
    dedupe_key         text DEFAULT NULL,
    tags               text[] DEFAULT NULL,
    concurrency_key    text DEFAULT NULL,
    scope_entity_id    text DEFAULT NULL,
    tenant_id          text DEFAULT NULL,
    allow_unknown_type boolean DEFAULT false
) RETURNS uuid
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF enqueue.job_type = 'webhook.deliver' THEN
        RAISE EXCEPTION 'notifyq: job type ''webhook.deliver'' is built in and enqueued by '
                        'notifyq itself, with the checks its own API makes: send webhooks with '
                        'app.webhooks.send, POST /v1/webhooks/messages or `notifyq webhooks '
                        'send` (resend and recover likewise)'
            USING ERRCODE = '22023';
    ELSIF enqueue.job_type = 'secret.reencrypt' THEN
        RAISE EXCEPTION 'notifyq: job type ''secret.reencrypt'' is built in and enqueued by '
                        'notifyq itself, with the checks its own API makes: rotate keys with '
                        'app.keys.rotate, POST /v1/admin/rotate-key or `notifyq keys rotate`'
            USING ERRCODE = '22023';
    END IF;
    RETURN (_enqueue(enqueue.job_type, enqueue.input, enqueue.run_at, enqueue.priority,
                     enqueue.pool, enqueue.max_attempts, enqueue.dedupe_key, enqueue.tags,
                     p_concurrency_key => enqueue.concurrency_key,
                     p_scope_entity_id => enqueue.scope_entity_id,
                     p_tenant_id => enqueue.tenant_id,
                     p_allow_unknown_type => enqueue.allow_unknown_type)).id;
END
$$;
