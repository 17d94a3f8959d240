"""``snip.convert``: swap a model's ``nn.Linear`` layers for ``snip.nn.Linear``
in place (docs/python.md)."""

import torch

from . import nn as snip_nn
from .errors import ConvertError
from .recipes import recipe_name


def convert(model, recipe="fp8", *, plan=None, module_filter_fn=None, gemm="bf16", seed=0):
    """Replaces every ``torch.nn.Linear`` of ``model`` that ``module_filter_fn``
    accepts by a ``snip.nn.Linear`` with the same parameters (the same
    Parameter objects), in place, so module names and ``state_dict()`` keys
    stay as they were and an optimizer built before keeps working.

    Args:
      model: a torch.nn.Module (CPU, float32/float64 parameters).
      recipe: the recipe of every converted layer (a name, a snip.Recipe, or
        "none"), unless ``plan`` gives one.
      plan: optional dict fully qualified module name -> recipe (e.g.
        {"model.layers.0.mlp.down_proj": "fp8"}); a layer it does not name
        gets ``recipe``. A name that is not an nn.Linear of the model is an
        error.
      module_filter_fn: optional ``fn(module, fqn) -> bool`` (torchao's
        signature); False keeps that layer a plain nn.Linear (e.g. lm_head).
      gemm: "bf16" or "fp32", the GEMM dtype of every converted layer.
      seed: stochastic rounding's seed; each layer's ``layer`` index is its
        position among the converted layers, in ``named_modules`` order.

    Returns the model. Raises snip.ConvertError when no layer is converted or
    a plan name is not an nn.Linear; snip.RecipeError for an unknown recipe.
    """
    linears = [(n, m) for n, m in model.named_modules() if type(m) is torch.nn.Linear or isinstance(m, snip_nn.Linear)]
    names = {n for n, _ in linears}
    for fqn in (plan or {}):
        if fqn not in names:
            raise ConvertError(f"snip.convert: plan: '{fqn}' is not an nn.Linear of the model")
    converted = 0
    for name, module in linears:
        if module_filter_fn is not None and not module_filter_fn(module, name):
            continue
        r = (plan or {}).get(name, recipe)
        if isinstance(module, snip_nn.Linear):
            module.set_recipe(r, gemm=gemm)
            module.layer = converted
        else:
            new = snip_nn.Linear.from_linear(module, recipe=r, gemm=gemm, seed=seed, layer=converted)
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, new)
        converted += 1
    if converted == 0:
        raise ConvertError(
            f"snip.convert: no nn.Linear of {type(model).__name__} was converted "
            f"({len(linears)} found{', all refused by module_filter_fn' if linears else ''})"
        )
    return model


def set_step(model, step):
    """Sets ``step`` (optimizer steps done, an int >= 0) on every
    snip.nn.Linear of ``model``: stochastic rounding's key. Call once per
    optimizer step."""
    if int(step) < 0:
        raise ConvertError(f"snip.set_step: step: expected an integer >= 0, got {step}")
    for m in model.modules():
        if isinstance(m, snip_nn.Linear):
            m.step = int(step)


def precision_table(model):
    """The recipe of every snip.nn.Linear of ``model``: dict fqn -> recipe name."""
    return {n: recipe_name(m.recipe) for n, m in model.named_modules() if isinstance(m, snip_nn.Linear)}
