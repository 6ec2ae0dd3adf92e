"""Enqueue: validate, ids, write, wake."""
