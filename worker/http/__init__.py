"""The one HTTP listener: metrics, health, readiness and (api/all) the /v1 ingest."""
