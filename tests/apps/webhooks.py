"""A bare App for the webhook process tests: ``webhook.deliver`` is built in."""

from notifyq import App

app = App()
