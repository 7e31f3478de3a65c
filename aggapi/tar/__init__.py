"""Tar streams, untrusted and unbounded: a sans-I/O push parser and the PAX writer and
async reader built on it. Shared by the agent's copy engine and the ncp client."""
