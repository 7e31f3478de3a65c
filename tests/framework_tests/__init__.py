"""Tests of the harness in tests/framework."""
