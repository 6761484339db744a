"""Test support: real PostgreSQL databases, real processes, a real hub."""
