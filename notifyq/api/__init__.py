"""The admin HTTP API of ``notifyq serve``: JSON under ``/v1`` (OpenAPI at ``/v1/openapi.json``),
bearer-token auth, ``/healthz``, ``/readyz`` and ``/metrics``. Build it with
:func:`notifyq.api.app.create_api`."""
