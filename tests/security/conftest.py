"""Fixtures of the security tests: the webhook tests' receiver on 127.0.0.1."""

from tests.webhooks.conftest import receiver

__all__ = ["receiver"]
