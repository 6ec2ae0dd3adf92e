"""The ``notifyq`` command line."""
