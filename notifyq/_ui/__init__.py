"""The dashboard of `notifyq serve` (``/ui``): pages over the same functions as the API."""
