"""Operator surfaces over HTTP: the admin JSON API (/v1/admin) and the web console (/console)."""
