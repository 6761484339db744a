"""Database plumbing: the pool, dedicated connections, locks, migrations, the embedded server."""
