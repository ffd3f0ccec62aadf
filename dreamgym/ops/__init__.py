"""Operations: running, tracking and shipping the learning code — the MLflow registry, the
promotion gate and lineage, service defaults and preflight checks, the nightly schedule, fan-out
on Ray, the bench and its README table, and the team stack."""
