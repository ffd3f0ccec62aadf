#!/usr/bin/env bash
# The shared Postgres's roles and databases, run as its superuser: by the postgres image on first
# start (docker-compose.yml mounts this folder at /docker-entrypoint-initdb.d), and by
# `dreamgym stack up` on every start (it is idempotent: a role's password is reset to the env's).
#
#   dreamgym  the pipeline's replay buffer; owns its database, no superuser: pgvector is created
#             here, by the superuser, so runs never need more than the database's owner
#   mlflow    the MLflow tracking server's backend store
#   prefect   the Prefect server's database
#
# Passwords come from the environment (infra/.env): never from arguments, which `ps` shows.
set -euo pipefail

psql -v ON_ERROR_STOP=1 --no-psqlrc --quiet --dbname postgres <<'SQL'
\getenv dreamgym_password DREAMGYM_DB_PASSWORD
\getenv mlflow_password MLFLOW_DB_PASSWORD
\getenv prefect_password PREFECT_DB_PASSWORD
SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE', name)
  FROM unnest(ARRAY['dreamgym', 'mlflow', 'prefect']) AS name
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = name) \gexec
ALTER ROLE dreamgym PASSWORD :'dreamgym_password';
ALTER ROLE mlflow PASSWORD :'mlflow_password';
ALTER ROLE prefect PASSWORD :'prefect_password';
SELECT format('CREATE DATABASE %I OWNER %I', name, name)
  FROM unnest(ARRAY['dreamgym', 'mlflow', 'prefect']) AS name
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = name) \gexec
\connect dreamgym
CREATE EXTENSION IF NOT EXISTS vector;
SQL
