"""The team stack: the shared services (Postgres + pgvector, MLflow, Prefect server and worker,
optionally a Ray head) as ordinary processes, the same as infra/docker-compose.yml runs them."""
