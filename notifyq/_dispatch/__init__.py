"""Claiming, executing and finishing runs."""
