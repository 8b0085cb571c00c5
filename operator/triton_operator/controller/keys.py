"""Key material the operator generates (the imperative shell: randomness)."""

from __future__ import annotations


def ssh_key_pair() -> tuple[str, str]:
    """A new Ed25519 key pair in OpenSSH's formats: (private key, public key line).

    `cryptography` is imported here, on the first multi-node service's first key, not with the
    operator: its bindings are about 7 MiB of resident memory that most operators never use."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, public + " triton-operator-group\n"
