"""Helpers for the integration tests: multi-rank launches, recording hooks, framework stand-ins."""
