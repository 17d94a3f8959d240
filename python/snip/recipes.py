"""Element formats and recipes, as ``snip formats`` lists them (docs/formats.md)."""

import json
import re

from . import _ops


class Recipe:
    """A named recipe: one quantization spec per GEMM operand (fprop.x,
    fprop.w, dgrad.dy, dgrad.w, wgrad.dy, wgrad.x), each with its element
    format, block shape, scale rule, scale format and rounding, as
    ``snip formats --recipes --json`` prints it (recipes/recipe.h).

    Attributes: ``name`` (str), ``description`` (str), ``operands`` (dict of
    operand name -> spec dict), ``error_feedback`` (bool), ``json`` (the
    recipe as JSON text, what the operators take).
    """

    def __init__(self, spec):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(
                spec.get("operands"), dict):
            raise _ops.RecipeError("snip.Recipe: expected a recipe's JSON form, a dict with 'name' (str) and "
                                   "'operands' (dict), as snip.recipes() gives")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", spec["name"]) or spec["name"] == "none":
            raise _ops.RecipeError(f"snip.Recipe: name: expected [A-Za-z][A-Za-z0-9_]* (at most 64 characters, "
                                   f"not 'none'), got {spec['name']!r}")
        self.name = spec["name"]
        self.description = spec.get("description", "")
        self.operands = dict(spec["operands"])
        self.error_feedback = bool(spec.get("error_feedback", False))
        self.json = json.dumps(spec, sort_keys=True)

    def __repr__(self):
        return f"snip.Recipe({self.name!r}: {self.description})"

    def __eq__(self, other):
        return isinstance(other, Recipe) and self.json == other.json

    def __hash__(self):
        return hash(self.json)


def formats():
    """Every element format (E4M3, E5M2, E2M1, ...): a list of dicts with the
    fields of ``snip formats --json`` (name, bits, exponent and mantissa
    widths, bias, largest and smallest normal/subnormal values, Inf/NaN)."""
    return json.loads(_ops.call(_ops.ops.formats_json))


def recipes(recipe_file=None):
    """The built-in recipes, plus those of ``recipe_file`` (a .toml or .json
    recipe file, docs/formats.md "Recipe files") when given: a dict name ->
    Recipe, sorted by name. ("none", accepted wherever a recipe is, is no
    recipe: no quantization.) Raises snip.RecipeError for a file that cannot be
    read or parsed (one line naming the file and field)."""
    if recipe_file is not None and not str(recipe_file):
        raise _ops.RecipeError("recipe_file: expected a path, got ''")
    out = {}
    for spec in json.loads(_ops.call(_ops.ops.recipes_json, str(recipe_file or ""))):
        out[spec["name"]] = Recipe(spec)
    return out


def load_recipes(recipe_file):
    """Only the recipes of ``recipe_file`` (dict name -> Recipe). Raises
    snip.RecipeError as ``recipes``."""
    if recipe_file is None:
        raise _ops.RecipeError("recipe_file: expected a path, got None")
    builtin = recipes()
    return {n: r for n, r in recipes(recipe_file).items() if n not in builtin}


def recipe_arg(recipe):
    """What the operators take for ``recipe``: "none", a built-in name, or a
    Recipe's JSON. Raises snip.RecipeError for another type."""
    if recipe is None:
        return "none"
    if isinstance(recipe, Recipe):
        return recipe.json
    if isinstance(recipe, str):
        if not recipe:
            raise _ops.RecipeError("recipe: expected a recipe name (snip.recipes()), 'none' or a snip.Recipe, got ''")
        return recipe
    raise _ops.RecipeError(f"recipe: expected a recipe name or a snip.Recipe, got {type(recipe).__name__}")


def recipe_name(recipe):
    return recipe.name if isinstance(recipe, Recipe) else str(recipe)
