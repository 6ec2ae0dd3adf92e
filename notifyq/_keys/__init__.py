"""Secrets at rest: the keyring, encrypted columns, rotation and retirement."""
