"""The toy tasks' starting models ship with the package (tasks/models): every machine starts from the same policy.

Pretraining follows each CPU's rounding (addition's start accuracy was 0.4305 on one machine and 0.4008 on another
of the same kind), so the default recipes' models are loaded from the package, their files checked against the
manifest's sha256 digests; only a changed recipe is pretrained here, and the run's config.json says so.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tomllib

import pytest

from tasks import TaskError, addition, bandit, pizza, tiny_lm
from tests.conftest import ROOT

MODELS = ROOT / "tasks" / "models"
DEFAULT_RECIPES = {"addition": addition.RECIPE, "pizza": pizza.RECIPE, "bandit": {**bandit.RECIPE, "seed": 0}}


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A cache with nothing in it, so that a model found was the shipped one."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(cache))
    return cache


def _never_built():
    raise AssertionError("a shipped model was pretrained again")


def test_the_default_recipes_are_shipped_and_their_files_match_the_manifest():
    manifest = json.loads((MODELS / "manifest.json").read_text())
    names = {f"{kind}-{tiny_lm.recipe_key(recipe)}" for kind, recipe in DEFAULT_RECIPES.items()}
    assert set(manifest["models"]) == names
    for kind, recipe in DEFAULT_RECIPES.items():
        folder = tiny_lm.shipped_model(kind, recipe)
        entry = manifest["models"][folder.name]
        assert json.loads((folder / "recipe.json").read_text()) == json.loads(json.dumps(recipe))
        assert {p.name for p in folder.iterdir()} == set(entry["files"])
        for name, digest in entry["files"].items():
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
        assert {"torch", "cpu", "date"} <= set(entry["built"])
    assert sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file()) < 2_000_000  # small enough to ship


def test_a_shipped_model_loads_without_pretraining(empty_cache):
    model, tokenizer = tiny_lm.cached_model("addition", addition.RECIPE, _never_built)
    assert model.config.hidden_size == addition.RECIPE["hidden_size"] and len(tokenizer) == 3 + len(addition.ALPHABET)
    assert not empty_cache.exists()  # nothing was built or cached


def test_the_shipped_addition_model_starts_at_a_fixed_accuracy(empty_cache, monkeypatch):
    # Bit-stable on this CPU build: the same value on repeated runs with 1 and 2 threads (0.40625 = 26 of 64).
    monkeypatch.setattr(addition, "build_addition_model", lambda recipe=None: _never_built())
    task = addition.AdditionTask(eval_problems=64, eval_k=1)
    model = task.load_policy("cpu")
    assert task.evaluate(model, seed=0)["accuracy"] == 26 / 64
    assert task.describe()["starting_model"] == "shipped tasks/models/addition-e6bf75c2d521 (sha256 76f09ef0966fe682)"
    assert pizza.PizzaTask(eval_samples=1).describe()["starting_model"].startswith("shipped tasks/models/pizza-")
    assert bandit.BanditTask().describe()["starting_model"].startswith("shipped tasks/models/bandit-")
    other_seed = tiny_lm.model_source("bandit", {**bandit.RECIPE, "seed": 1})
    assert other_seed == f"rebuilt on this machine (cache {empty_cache}/bandit-{tiny_lm.recipe_key({**bandit.RECIPE, 'seed': 1})}, not built yet)"


@pytest.mark.parametrize("damage, message", [
    ("flip", "model.safetensors has sha256 [0-9a-f]{16}, the manifest says 76f09ef0966fe682"),
    ("delete", "tokenizer.json is missing"),
    ("no_manifest", "cannot read the shipped models' manifest"),
])
def test_a_damaged_shipped_model_is_one_line_never_a_silent_rebuild(tmp_path, empty_cache, monkeypatch, damage, message):
    copy = tmp_path / "models"
    shutil.copytree(MODELS, copy)
    folder = copy / f"addition-{tiny_lm.recipe_key(addition.RECIPE)}"
    if damage == "flip":
        weights = bytearray((folder / "model.safetensors").read_bytes())
        weights[-1] ^= 1
        (folder / "model.safetensors").write_bytes(bytes(weights))
    elif damage == "delete":
        (folder / "tokenizer.json").unlink()
    else:
        (copy / "manifest.json").unlink()
    monkeypatch.setattr(tiny_lm, "SHIPPED", copy)
    with pytest.raises(TaskError, match=message) as raised:
        tiny_lm.cached_model("addition", addition.RECIPE, _never_built)
    assert "\n" not in str(raised.value)
    assert not empty_cache.exists()


def test_a_changed_recipe_is_rebuilt_here_and_the_run_records_it(tmp_path, empty_cache, monkeypatch, run_cli):
    changed = {**pizza.RECIPE, "sentences": 64, "hidden_size": 16, "steps": 2}
    builds = []

    def tiny_build(recipe):
        builds.append(recipe)
        return pizza_build(recipe)

    pizza_build = pizza.build_pizza_model
    monkeypatch.setattr(pizza, "RECIPE", changed)
    monkeypatch.setattr(pizza, "build_pizza_model", tiny_build)
    out = tmp_path / "run"
    code, _, err = run_cli("run", "--task", "pizza", "--algo", "grpo", "--group-size", "2", "--prompts-per-step", "1",
                           "--steps", "1", "--eval-every", "0", "--eval-samples", "4", "--device", "cpu", "--out", out)
    assert code == 0, err
    assert builds == [changed]  # built once, then read from the cache
    cached = empty_cache / f"pizza-{tiny_lm.recipe_key(changed)}"
    digest = hashlib.sha256((cached / "model.safetensors").read_bytes()).hexdigest()[:16]
    task = json.loads((out / "config.json").read_text())["task"]
    assert task["starting_model"] == f"rebuilt on this machine (cache {cached}, sha256 {digest})"
    assert task["pretrain_recipe"] == json.loads(json.dumps(changed))


def test_the_models_are_package_data_of_a_non_editable_install():
    # A wheel built with these globs carried all 19 files (checked by hand); without them it carried none.
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tasks"]
    packaged = {p for pattern in globs for p in (ROOT / "tasks").glob(pattern) if p.is_file()}
    assert packaged == {p for p in MODELS.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
