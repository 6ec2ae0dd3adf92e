"""Secrets at rest: a versioned keyring of master keys, AES-256-GCM ciphertexts bound to the
row they live in, the registry of encrypted columns, and the admin side of key rotation."""
