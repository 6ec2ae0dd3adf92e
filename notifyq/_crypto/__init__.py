"""Encryption primitives: versioned master keys and self-describing AES-256-GCM ciphertexts."""
