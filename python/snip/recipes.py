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


GEMMS = ("fprop", "dgrad", "wgrad")


def per_gemm(recipes_by_gemm):
    """One Recipe from a recipe per GEMM, {"fprop": r, "dgrad": r, "wgrad": r}
    (names or snip.Recipe): its fprop.x/fprop.w specs are fprop's recipe's,
    and so on, as `snip train` runs a layer planned per GEMM
    (precision.granularity = "gemm"). A GEMM given "none" or "bf16" takes the
    bf16 recipe's specs (the operands cast to BF16: no quantization under
    gemm="bf16"). Raises snip.RecipeError for missing or unknown keys, an
    unknown recipe, or one with error feedback."""
    if set(recipes_by_gemm) != set(GEMMS):
        raise _ops.RecipeError(f"recipe per GEMM: expected the keys fprop, dgrad and wgrad, got "
                               f"{sorted(recipes_by_gemm)}")
    known = recipes()
    ops, names = {}, []
    for g in GEMMS:
        r = recipes_by_gemm[g]
        if r is None or r == "none":
            r = "bf16"
        if isinstance(r, str):
            if r not in known:
                raise _ops.RecipeError(f"recipe per GEMM: {g}: unknown recipe '{r}' (known: {', '.join(known)})")
            r = known[r]
        if not isinstance(r, Recipe):
            raise _ops.RecipeError(f"recipe per GEMM: {g}: expected a recipe name or a snip.Recipe, got "
                                   f"{type(r).__name__}")
        if r.error_feedback:
            raise _ops.RecipeError(f"recipe per GEMM: {g}: recipe '{r.name}' has error feedback, which belongs "
                                   "to a whole layer")
        for operand, spec in r.operands.items():
            if operand.startswith(g + "."):
                ops[operand] = spec
        names.append(r.name)
    return Recipe({"name": "_".join(["g"] + names), "description": f"per GEMM: fprop {names[0]}, dgrad "
                   f"{names[1]}, wgrad {names[2]}", "operands": ops})


def recipe_arg(recipe):
    """What the operators take for ``recipe``: "none", a built-in name, or a
    Recipe's JSON (a dict of a recipe per GEMM is composed by per_gemm).
    Raises snip.RecipeError for another type."""
    if recipe is None:
        return "none"
    if isinstance(recipe, dict):
        recipe = per_gemm(recipe)
    if isinstance(recipe, Recipe):
        return recipe.json
    if isinstance(recipe, str):
        if not recipe:
            raise _ops.RecipeError("recipe: expected a recipe name (snip.recipes()), 'none' or a snip.Recipe, got ''")
        return recipe
    raise _ops.RecipeError(f"recipe: expected a recipe name or a snip.Recipe, got {type(recipe).__name__}")


def recipe_name(recipe):
    """A recipe's name for tables; a per-GEMM dict as "fprop=a,dgrad=b,wgrad=c"."""
    if isinstance(recipe, dict):
        return ",".join(f"{g}={recipe_name(recipe.get(g))}" for g in GEMMS)
    return recipe.name if isinstance(recipe, Recipe) else str(recipe)


def load_plan(path, recipe_file=None):
    """The per-layer precision of a plan file of `snip plan` (``--json`` /
    ``--out``, docs/planner.md; also a run's plans/step-N.json): a dict
    module name -> recipe, or, for a plan made per GEMM (granularity
    "gemm"), module name -> {"fprop": r, "dgrad": r, "wgrad": r}. A recipe
    is a built-in's name, or, given ``recipe_file`` (the precision.recipe_file
    the plan was measured with), that file's snip.Recipe. Pass it as
    ``snip.convert(model, plan=...)``. Raises snip.Error naming the file for
    an unreadable file, invalid JSON, no "assignments" object, a per-GEMM
    layer missing a GEMM, or an option that is neither a built-in recipe nor
    one of ``recipe_file``'s (nor bf16/none)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise _ops.RecipeError(f"{path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise _ops.RecipeError(f"{path}: not JSON ({e})") from None
    a = doc.get("assignments") if isinstance(doc, dict) else None
    if not isinstance(a, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in a.items()):
        raise _ops.RecipeError(f"{path}: expected a plan file of `snip plan` with an \"assignments\" object of "
                               "item -> option")
    known = recipes(recipe_file) if recipe_file is not None else recipes()
    builtin = recipes() if recipe_file is not None else known

    def resolve(option):
        if option in ("bf16", "none") or option in builtin:
            return option
        if option in known:
            return known[option]
        raise _ops.RecipeError(f"{path}: assignments: option '{option}' is not a built-in recipe"
                               + ("" if recipe_file is not None else " (a recipe of a recipe file? pass recipe_file=)")
                               + (f" nor one of {recipe_file}'s" if recipe_file is not None else ""))

    plan, gemm = {}, {}
    for item, option in a.items():
        option = resolve(option)
        layer, sep, g = item.rpartition(":")
        if sep and g in GEMMS:
            gemm.setdefault(layer, {})[g] = option
        else:
            plan[item] = option
    for layer, by in gemm.items():
        if set(by) != set(GEMMS):
            raise _ops.RecipeError(f"{path}: assignments: layer '{layer}' has {sorted(by)}, expected fprop, dgrad "
                                   "and wgrad")
        plan[layer] = by
    return plan
