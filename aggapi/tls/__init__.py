"""TLS and the PKI behind it: serving with certificates reloaded from disk, and making
CAs, certificates and signing keys (``aggapi certs``). Server-side only (cryptography)."""
