-- The customer portal (issue 34 item 8): an application mints a one-time sign-in link for one
-- of its tenants (POST /v1/portal/links); the link is exchanged for a portal session once.
-- Neither table holds a secret in clear: a link's code and a session's cookie are 32 random
-- bytes kept as their SHA-256 (the primary key: a lookup is one index probe, and a copy of the
-- table signs nobody in). A link is tied to one tenant, expires at `expires_at` and is spent
-- by the UPDATE that sets `used_at` (one exchange wins, whatever the concurrency).

CREATE TABLE portal_link (
    code_hash   bytea PRIMARY KEY CHECK (octet_length(code_hash) = 32),
    tenant_id   text NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 512),
    read_only   boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);
CREATE INDEX portal_link_expires_idx ON portal_link (expires_at);

-- A signed-in customer: by a link (token_name NULL) or by an API token limited to tenants
-- (token_name: the session ends when that token is removed or no longer has the tenant).
CREATE TABLE portal_session (
    cookie_hash bytea PRIMARY KEY CHECK (octet_length(cookie_hash) = 32),
    tenant_id   text NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 512),
    read_only   boolean NOT NULL DEFAULT false,
    token_name  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX portal_session_expires_idx ON portal_session (expires_at);
