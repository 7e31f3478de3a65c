"""How the apiserver and the agent serve HTTP: bounded waits for a request head and for
body bytes, buffer sizes, and JSON log lines that carry each request's Audit-ID."""
