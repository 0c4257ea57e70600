"""Tiny from-scratch causal LMs for the toy tasks: a real character-level ``PreTrainedTokenizerFast``
and a small ``LlamaForCausalLM``, pretrained deterministically.

The default recipes' models ship with the package (``tasks/models``, each file's sha256 in its
``manifest.json``): pretraining follows each CPU's rounding, so a model rebuilt elsewhere is another starting
policy (addition's start accuracy differed between two machines of one kind, 0.4305 against 0.4008). Any
other recipe is pretrained on first use and cached outside the repository.

Both are ordinary Hugging Face objects (``save_pretrained`` / ``from_pretrained``), so every
algorithm, and TRL, sees them exactly as it would see a hub model.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from tasks.base import TaskError

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
SHIPPED = Path(__file__).resolve().parent / "models"  # the packaged models and their manifest.json


def cache_root() -> Path:
    """Where pretrained task models live: $GRPO_BENCH_CACHE, else ~/.cache/grpo-bench."""
    return Path(os.environ.get("GRPO_BENCH_CACHE", Path.home() / ".cache" / "grpo-bench"))


def char_tokenizer(alphabet: Sequence[str]) -> PreTrainedTokenizerFast:
    """One token per character (or per listed symbol), plus <pad>, <eos> and <unk>."""
    from transformers import PreTrainedTokenizerFast  # here, not at import: `run --help` reads this module

    vocab = {tok: i for i, tok in enumerate(list(SPECIAL_TOKENS) + list(alphabet))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()  # characters join back with no separator
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_llama(tokenizer, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, max_positions: int = 64, seed: int = 0) -> LlamaForCausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model


def pretrain(model, tokenizer, texts: Sequence[str], *, steps: int, batch_size: int, lr: float, seed: int,
             trim_batches: bool = False) -> list[float]:
    """Next-token pretraining on ``texts`` (each followed by EOS). Deterministic for a seed on CPU.

    ``trim_batches`` cuts each batch to its longest text instead of the corpus's: the texts are
    right-padded, so the loss is the same and steps are cheaper when a few texts are much longer."""
    rng = torch.Generator().manual_seed(seed)
    encoded = tokenizer([t + tokenizer.eos_token for t in texts], padding=True, return_tensors="pt", add_special_tokens=False)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    labels = ids.masked_fill(mask == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / steps))
    model.train()
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, ids.size(0), (batch_size,), generator=rng)
        width = int(mask[idx].sum(1).max()) if trim_batches else ids.size(1)
        loss = model(input_ids=ids[idx, :width], attention_mask=mask[idx, :width], labels=labels[idx, :width]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses


def recipe_key(recipe: dict) -> str:
    """The short hash of a recipe that names its model's folder: any change to a setting is a new model."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shipped_model(kind: str, recipe: dict) -> Optional[Path]:
    """The packaged folder of ``recipe``'s model, every file checked against the manifest; None when that recipe is
    not shipped. A missing manifest or file, or a digest that differs, is one TaskError line: never a silent rebuild."""
    manifest_path = SHIPPED / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise TaskError(f"cannot read the shipped models' manifest {manifest_path} ({type(exc).__name__}): "
                        "grpo-bench was installed without tasks/models; reinstall it") from None
    name = f"{kind}-{recipe_key(recipe)}"
    entry = manifest.get("models", {}).get(name)
    if entry is None:
        return None
    folder = SHIPPED / name
    for file, digest in entry["files"].items():
        try:
            actual = _sha256(folder / file)
        except OSError:
            raise TaskError(f"shipped model {name}: {folder / file} is missing; reinstall grpo-bench") from None
        if actual != digest:
            raise TaskError(f"shipped model {name}: {file} has sha256 {actual[:16]}, the manifest says {digest[:16]}: "
                            "the file was changed or damaged; reinstall grpo-bench")
    return folder


def model_source(kind: str, recipe: dict) -> str:
    """Where ``cached_model(kind, recipe)`` takes its model from, for a run's config.json: the shipped copy, or one
    pretrained on this machine (another CPU's rounding gives another starting policy)."""
    folder = shipped_model(kind, recipe)
    if folder is not None:
        return f"shipped tasks/models/{folder.name} (sha256 {_sha256(folder / 'model.safetensors')[:16]})"
    target = cache_root() / f"{kind}-{recipe_key(recipe)}"
    weights = target / "model.safetensors"
    built = f", sha256 {_sha256(weights)[:16]}" if weights.is_file() else ", not built yet"
    return f"rebuilt on this machine (cache {target}{built})"


def cached_model(kind: str, recipe: dict, build: Callable[[], tuple]) -> tuple:
    """Load the (model, tokenizer) that ``recipe`` describes: the shipped copy when the recipe is shipped, else
    from the cache, built and cached on first use.

    The cache key is a hash of the recipe, so changing any pretraining setting builds a new model;
    the directory is written under a temporary name and renamed, so a killed build leaves nothing
    half-written behind.
    """
    target = shipped_model(kind, recipe)
    if target is None:
        target = cache_root() / f"{kind}-{recipe_key(recipe)}"
        if not (target / "config.json").exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            # Cells of one matrix start side by side: one builds, the others wait for it instead of building it again.
            with open(target.parent / f".{target.name}.lock", "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # say why nothing happens for a while
                    print(f"waiting for another process building the {kind} starting model ({target})", file=sys.stderr,
                          flush=True)
                    fcntl.flock(lock, fcntl.LOCK_EX)
                if not (target / "config.json").exists():
                    print(f"building the {kind} starting model for a recipe that is not shipped ({recipe.get('steps', '?')} "
                          f"pretraining steps, minutes on one core); cached in {target}", file=sys.stderr, flush=True)
                    _build_into(target, kind, recipe, build)
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    return model, tokenizer


def _build_into(target: Path, kind: str, recipe: dict, build: Callable[[], tuple]) -> None:
    model, tokenizer = build()
    staging = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=target.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
    try:
        os.replace(staging, target)
    except OSError:  # a process without the lock (another machine on a shared cache) won the race: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
