"""Webhook delivery: Standard Webhooks signing, the SSRF guard, endpoints and messages
(``app.webhooks``), the HTTP client and the retry schedule of the ``webhook.deliver`` handler."""
