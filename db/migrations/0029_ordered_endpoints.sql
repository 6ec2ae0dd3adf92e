-- Ordered webhook endpoints (issue 34 item 2): an endpoint created or updated with
-- `ordered = true` gets its messages one at a time, in the order they were sent, each only after
-- the one before it succeeded or was given up.
--
-- Nothing in the claim changes. The endpoint's concurrency key (`webhook:<id>`) gets a row in
-- key_concurrency with its limit pinned to 1, which the adaptive share (key_concurrency_resize)
-- leaves alone; and a delivery of it that is to be tried again keeps its place at the head of
-- the key (its run is given the best priority before it snoozes:
-- webhook_delivery_keep_place), so the keyed claim (_claim_keyed, 0021), which takes a key's
-- head run (best priority, then oldest run_at) and passes over a key whose head is not due,
-- holds the later deliveries back until the head is over, without moving their run_at: when
-- the head succeeds the next one is due at once, with no backoff charged to it.

ALTER TABLE webhook_endpoint ADD COLUMN ordered boolean NOT NULL DEFAULT false;

-- A limit an operator or a feature set on purpose: adaptive resizing never changes it.
ALTER TABLE key_concurrency ADD COLUMN pinned boolean NOT NULL DEFAULT false;

