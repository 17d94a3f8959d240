"""``snip.convert``: swap a model's ``nn.Linear`` layers for ``snip.nn.Linear``
in place (docs/python.md)."""

import fnmatch

import torch

from . import nn as snip_nn
from .errors import ConvertError
from .recipes import recipe_name


def _linears(model):
    """(fqn, module) of every nn.Linear and snip.nn.Linear of ``model``, a
    shared module under each of its names, in named_modules order."""
    return [(n, m) for n, m in model.named_modules(remove_duplicate=False)
            if type(m) is torch.nn.Linear or isinstance(m, snip_nn.Linear)]


def convert(model, recipe="fp8", *, plan=None, module_filter_fn=None, gemm="bf16", seed=0):
    """Replaces every ``torch.nn.Linear`` of ``model`` that ``module_filter_fn``
    accepts by a ``snip.nn.Linear`` with the same parameters (the same
    Parameter objects) and hooks, in place, so module names and
    ``state_dict()`` keys stay as they were and an optimizer built before
    keeps working. A snip.nn.Linear it accepts gets the new recipe, gemm and
    seed. A module reachable under several names (tied) is replaced under
    each by one snip.nn.Linear. All or nothing: an error leaves the model as
    it was.

    Args:
      model: a torch.nn.Module holding the layers (CPU; float32, float64,
        bfloat16 or float16 parameters); to convert a bare nn.Linear, use
        snip.nn.Linear.from_linear.
      recipe: the recipe of every converted layer (a name, a snip.Recipe, or
        "none"), unless ``plan`` gives one.
      plan: optional dict module name or glob -> recipe (e.g.
        {"model.layers.0.mlp.down_proj": "fp8", "*.o_proj": "mxfp8"}): a
        layer's exact name wins, else the first glob (fnmatch: *, ?, [...])
        that matches it; a layer it does not match gets ``recipe``. A name
        that is not an nn.Linear of the model, or a glob that matches none,
        is an error.
      module_filter_fn: optional ``fn(module, fqn) -> bool`` (torchao's
        signature); False keeps that layer as it is (e.g. lm_head).
      gemm: "bf16" or "fp32", the GEMM dtype of every converted layer.
      seed: stochastic rounding's seed, an int in [0, 2^63).

    Afterwards every snip.nn.Linear of the model has as ``layer`` (the key
    of its stochastic rounding) its position among the model's
    snip.nn.Linear modules in named_modules order.

    Returns the model. Raises snip.ConvertError when no layer is converted, a
    plan name is not an nn.Linear, or ``model`` is not a container of
    layers; snip.RecipeError for an unknown recipe or a bad gemm or seed.
    """
    if not isinstance(model, torch.nn.Module):
        raise ConvertError(f"snip.convert: model: expected a torch.nn.Module, got {type(model).__name__}")
    if type(model) is torch.nn.Linear or isinstance(model, snip_nn.Linear):
        raise ConvertError("snip.convert: model is itself a Linear layer, which cannot be replaced in place: use "
                           "snip.nn.Linear.from_linear(layer, recipe=...)")
    if plan is not None and not isinstance(plan, dict):
        raise ConvertError(f"snip.convert: plan: expected a dict fqn -> recipe, got {type(plan).__name__}")
    linears = _linears(model)
    names = {n for n, _ in linears}
    globs = [k for k in plan or {} if any(c in k for c in "*?[")]
    for key in plan or {}:
        if key in globs and not any(fnmatch.fnmatchcase(n, key) for n in names):
            raise ConvertError(f"snip.convert: plan: '{key}' matches no nn.Linear of the model")
        if key not in globs and key not in names:
            raise ConvertError(f"snip.convert: plan: '{key}' is not an nn.Linear of the model")

    def planned(name):
        if plan and name in plan:
            return plan[name]
        for g in globs:
            if fnmatch.fnmatchcase(name, g):
                return plan[g]
        return recipe
    # Decide and build everything first: an error leaves the model untouched.
    chosen = {}  # id(module) -> (module, recipe)
    for name, module in linears:
        if module_filter_fn is not None and not module_filter_fn(module, name):
            continue
        r = planned(name)
        if id(module) in chosen and chosen[id(module)][1] != r:
            raise ConvertError(f"snip.convert: plan: '{name}' is a module shared with another name that gets "
                               f"another recipe ({recipe_name(chosen[id(module)][1])} vs {recipe_name(r)})")
        chosen[id(module)] = (module, r)
    if not chosen:
        raise ConvertError(
            f"snip.convert: no nn.Linear of {type(model).__name__} was converted "
            f"({len(names)} found{', all refused by module_filter_fn' if names else ''})")
    # Every replacement built now checks its recipe, gemm and seed (for a
    # snip.nn.Linear it only checks them: the layer itself is updated below).
    new = {key: (module, snip_nn.Linear.from_linear(module, recipe=r, gemm=gemm, seed=seed))
           for key, (module, r) in chosen.items()}
    # Now change the model.
    for name, module in linears:
        if id(module) not in new:
            continue
        old, replacement = new[id(module)]
        if isinstance(old, snip_nn.Linear):
            old.set_recipe(replacement.recipe, gemm=gemm)
            old.seed = seed
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, replacement)
    seen = {}
    for _, m in _linears(model):
        if isinstance(m, snip_nn.Linear) and id(m) not in seen:
            seen[id(m)] = m
            m.layer = len(seen) - 1
    return model


def set_step(model, step):
    """Sets ``step`` (optimizer steps done, an int in [0, 2^32)) on every
    snip.nn.Linear of ``model``: stochastic rounding's key. Call once per
    optimizer step."""
    for m in model.modules():
        if isinstance(m, snip_nn.Linear):
            m.step = step


def precision_table(model):
    """The recipe of every snip.nn.Linear of ``model`` under each of its
    names: dict fqn -> recipe name."""
    return {n: recipe_name(m.recipe) for n, m in model.named_modules(remove_duplicate=False)
            if isinstance(m, snip_nn.Linear)}
