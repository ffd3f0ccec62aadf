-- The experience replay buffer: tasks, trajectories and transitions with an embedding each.
-- {embedding_dim} is the encoder's dimension, rendered in by dreamgym/buffer/migrations.py; the
-- checksum recorded for this migration covers the rendered text, so a database made for one
-- encoder refuses another instead of mixing vectors of different sizes.
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE tasks (
    task_id     text PRIMARY KEY,
    env         text NOT NULL,
    instruction text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE trajectories (
    trajectory_id text PRIMARY KEY,
    task_id       text NOT NULL REFERENCES tasks (task_id),
    env           text NOT NULL,
    source        text NOT NULL CHECK (source IN ('real', 'synthetic')),
    policy        text NOT NULL,
    model_version text,
    run_id        text,
    data_version  text,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE transitions (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    content_hash  text NOT NULL UNIQUE,
    trajectory_id text NOT NULL REFERENCES trajectories (trajectory_id),
    task_id       text NOT NULL REFERENCES tasks (task_id),
    env           text NOT NULL,
    step          integer NOT NULL CHECK (step >= 0),
    state         text NOT NULL,
    action        text NOT NULL,
    next_state    text NOT NULL,
    reward        double precision NOT NULL,
    terminated    boolean NOT NULL,
    truncated     boolean NOT NULL,
    won           boolean NOT NULL,
    lost          boolean NOT NULL,
    score         bigint NOT NULL,
    max_score     bigint NOT NULL,
    reasoning     text,
    source        text NOT NULL CHECK (source IN ('real', 'synthetic')),
    policy        text NOT NULL,
    model_version text,
    run_id        text,
    data_version  text,
    recorded_at   timestamptz NOT NULL,             -- when the transition happened (record's created_at)
    created_at    timestamptz NOT NULL DEFAULT now(), -- when it entered the buffer
    embedding     vector({embedding_dim})
);

CREATE INDEX transitions_embedding_hnsw ON transitions USING hnsw (embedding vector_cosine_ops);
CREATE INDEX transitions_env_source ON transitions (env, source);
CREATE INDEX transitions_task ON transitions (task_id);
CREATE INDEX transitions_trajectory_step ON transitions (trajectory_id, step);
