"""Webhook delivery: endpoints, messages, signing, the SSRF-guarded transport."""
