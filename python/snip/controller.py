"""``snip.Controller``: SNIP's precision controller inside your own training
loop (docs/python.md "The controller").

At every plan step it measures, on one micro-batch, what quantizing each
linear layer would cost (the loss divergence of fprop, the weight divergence
of dgrad and wgrad, from your AdamW's state), sums those measurements over
the ranks of ``torch.distributed``, solves the same integer linear program as
``snip train`` (CBC) for the cheapest precision per layer under the FP4
budget, and sets every layer's recipe; before the first plan and in the last
part of the run every layer runs the warmup and final precision. The
decisions, the schedule and the statistics are the C++ controller's
(src/method/controller.cpp, through ``torch.classes.snip.Controller`` of
src/python/ops.cpp); this module runs the stats step's passes on your model
(the probes of src/method/stats.h, pass by pass) and installs the plans.

The loop::

    ctl = snip.Controller(model, opt, budget=0.75, options=("nvfp4", "fp8"), max_steps=1000)
    for step, ids in enumerate(batches):
        ctl.begin_step(lambda: model(ids, labels=ids).loss)   # may measure and re-plan
        model(ids, labels=ids).loss.backward()
        opt.step(); opt.zero_grad()
        ctl.end_step()
"""

import json
import math
import numbers
import os
import time

import torch

from . import _ops
from ._probe import Probe as _Probe
from . import nn as snip_nn
from .convert import _linears, convert
from .errors import ConvertError, Error, PlanError, RecipeError
from .recipes import formats, load_recipes, per_gemm, recipe_arg, recipes as all_recipes

# Hugging Face Llama module names -> the roles of docs/glossary.md.
_HF_ROLES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
             "down_proj": "down"}

# [precision] options a keyword of Controller may set (docs/operations.md has
# each one's meaning and default); budget, options, pins, policy and
# recipe_file have keywords of their own.
_PRECISION_KEYS = ("warmup_steps", "warmup_fraction", "warmup_precision", "initial_interval",
                   "initial_interval_fraction", "final_interval", "final_interval_fraction",
                   "final_high_precision_fraction", "final_precision", "smoothing", "alpha", "low_option",
                   "curvature_probes", "granularity", "first_order", "budget_unit", "gemm_times",
                   "calibrate_seconds")


def hf_role(fqn):
    """The role of a Hugging Face Llama linear layer from its module name
    ("model.layers.3.self_attn.q_proj" -> "q"; q, k, v, o, gate, up, down),
    or None for a name of another shape."""
    return _HF_ROLES.get(fqn.rpartition(".")[2])


def _toml_value(key, v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        raise PlanError(f"snip.Controller: {key}: expected a finite number, got {v}")
    if isinstance(v, (int, float, str)):
        return json.dumps(v)  # a JSON number or string is a TOML one
    if isinstance(v, (list, tuple)) and all(isinstance(e, str) for e in v):
        return json.dumps(list(v))
    raise PlanError(f"snip.Controller: {key}: expected a bool, number, string or list of strings, got {v!r}")


def _number(key, v):
    """A real number (Python's or numpy's) as float; PlanError naming ``key`` otherwise."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise PlanError(f"snip.Controller: {key}: expected a number, got {v!r}")
    return float(v)


def _integer(key, v, least):
    """An integer >= least (Python's or numpy's) as int; PlanError naming ``key`` otherwise."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < least:
        raise PlanError(f"snip.Controller: {key}: expected an integer >= {least}, got {v!r}")
    return int(v)


def _plain(key, v):
    """A [precision] option's value as a Python bool, int, float or str (numpy scalars unwrapped)."""
    if isinstance(v, (bool, str)):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    raise PlanError(f"snip.Controller: {key}: expected a bool, number or string, got {v!r}")


def _world():
    """The size of torch.distributed's world (1 when it is not initialised)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def _check_call(f, *args, what=""):
    """Runs a method of the C++ controller; its one-line ValueError becomes
    snip.PlanError (prefixed by ``what``)."""
    try:
        return f(*args)
    except (ValueError, RuntimeError) as e:
        text = str(e).strip().splitlines()
        raise PlanError(what + (text[0] if text else type(e).__name__)) from None


class Plan:
    """A decision of the controller: ``assignments`` (dict layer name, or
    "layer:fprop|dgrad|wgrad" at per-GEMM granularity, -> option), ``json``
    (the plan as ``snip train`` saves it in RUN/plans/step-s.json: budget,
    FP4 share, solver status, Q table; every rank holds rank 0's), ``step``
    (optimizer steps done when it was decided), ``phase`` ("warmup", "plan"
    or "final"), ``fp4_share`` (fraction of the
    controlled layers' FLOPs at the low option). ``str(plan)`` is the table
    ``snip plan show`` prints."""

    def __init__(self, assignments, plan_json, table, fp4_share, step, phase):
        self.assignments = assignments
        self.json = plan_json
        self.fp4_share = fp4_share
        self.step = step
        self.phase = phase
        self._table = table

    def __str__(self):
        return self._table or "\n".join(f"{k}: {v}" for k, v in self.assignments.items())

    def __repr__(self):
        return (f"snip.Plan(step={self.step}, phase={self.phase}, fp4_share={self.fp4_share:.4f}, "
                f"{len(self.assignments)} items)")


class Controller:
    """SNIP's precision controller on a PyTorch model.

    Args:
      model: the torch.nn.Module to control (not a DistributedDataParallel
        wrapper: pass its ``.module``). Its linear layers (``torch.nn.Linear``
        or ``snip.nn.Linear``) that ``module_filter_fn`` accepts, by default
        every one but the output head (``model.get_output_embeddings()`` and
        modules named ``lm_head``), are converted in place to snip.nn.Linear
        (``snip.convert``: same parameters and state_dict keys). They must be
        registered in forward order (Hugging Face models are); a layer reached
        under several names (tied) is one layer.
      optimizer: the ``torch.optim.AdamW`` that trains them (weight
        divergence is the change of its update, from its state).
      budget: the FP4 FLOPs share to reach, a fraction in [0, 1]
        (precision.budget).
      options: the options a layer may run: recipe names of snip.recipes()
        (or of ``recipe_file``) and "bf16" (precision.options; must hold
        ``low_option``, "fp4" by default: give low_option="nvfp4" with
        options=("nvfp4", "fp8")). When low_option is not given it is the
        first option with 4-bit elements.
      pins: dict glob -> option (precision.pins): the layers a glob matches
        (the whole name or a suffix after a '.', e.g. "*.down_proj",
        "layers.0.*") always run that option.
      max_steps: the run's optimizer steps S (train.max_steps): the schedule
        (warmup, plan steps, final phase) is in fractions of it.
      policy: "snip" (default), "min-rel-err", "layer-type",
        "first-last-fp8", "random", "uniform-<option>" (precision.policy).
      recipe_file: a .toml/.json recipe file whose recipes the options may
        name (precision.recipe_file).
      gemm: "bf16" (default) or "fp32": the GEMM dtype of the layers.
      seed: the probes' noise and stochastic rounding's seed (train.seed).
      run_dir: a folder for plans/step-s.json and stats/step-s.json, as
        ``snip train`` writes them (rank 0 only); None = none.
      verbose: print the plan table at each decision (stderr).
      roles: dict fqn -> role, or ``fn(fqn) -> role``, for models whose names
        are not Hugging Face Llama's (default: ``snip.controller.hf_role``);
        the roles label ``metrics()``'s per-role shares.
      module_filter_fn: ``fn(module, fqn) -> bool`` (torchao's signature),
        the layers to control.
      tokens: with ``budget_unit="time"`` (or ``gemm_times``), the rows per
        micro-batch of the layers' inputs (batch_size x seq_len), int: the
        GEMM shapes {T, IN, OUT} the table times. micro_batches: micro-batches
        per optimizer step (gradient accumulation), int >= 1.
      grad_scale: the factor of dL/dW the optimizer sees relative to
        loss_fn's loss (e.g. 1/accumulation steps when the loss is not
        pre-scaled, or the clip coefficient), > 0.
      **precision: any other [precision] option of ``snip train``
        (warmup_steps, warmup_fraction, warmup_precision, initial_interval,
        initial_interval_fraction, final_interval, final_interval_fraction,
        final_high_precision_fraction, final_precision, smoothing, alpha,
        low_option, curvature_probes, granularity, first_order,
        budget_unit, gemm_times, calibrate_seconds), with the same meaning,
        units and defaults (docs/operations.md). ``budget_unit="time"``:
        ``budget`` is the plans' linear-GEMM seconds per step as a ratio to
        the same GEMMs in BF16 (docs/method.md "Budget in measured time"),
        from the table ``gemm_times`` names (``snip doctor --calibrate``'s
        RUN/gemm_times.json) or, without one, a calibration on the layers'
        device when the controller is made (at most ``calibrate_seconds``;
        progress on stderr with ``verbose``); written to
        ``run_dir/gemm_times.json``; plans then carry ``gemm_seconds`` and
        ``time_ratio``.

    Everything is checked before the model changes: after an error it is
    as it was. Raises snip.ConvertError when no linear layer is matched,
    snip.PlanError for a bad option (one line naming it) or a budget the
    pins make infeasible, snip.RecipeError for an unknown recipe file or an
    option that keeps state between calls (delayed scaling, error
    feedback: not yet), snip.Error for an optimizer other than AdamW or a
    layer whose weight it does not train.
    """

    def __init__(self, model, optimizer, *, budget=0.75, options=("fp4", "fp8"), pins=None, max_steps,
                 policy="snip", recipe_file=None, gemm="bf16", seed=0, run_dir=None, verbose=False, roles=None,
                 module_filter_fn=None, grad_scale=1.0, tokens=None, micro_batches=1, **precision):
        # Everything is checked before the model changes: an error leaves it as it was.
        if not isinstance(model, torch.nn.Module):
            raise ConvertError(f"snip.Controller: model: expected a torch.nn.Module, got {type(model).__name__}")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise ConvertError("snip.Controller: model: expected the module inside DistributedDataParallel "
                               "(ddp.module), got the wrapper")
        if not isinstance(optimizer, torch.optim.AdamW):
            raise Error(f"snip.Controller: optimizer: expected a torch.optim.AdamW (weight divergence reads its "
                        f"state), got {type(optimizer).__name__}")
        for k in precision:
            if k not in _PRECISION_KEYS:
                raise PlanError(f"snip.Controller: unknown option {k!r} (expected one of budget, options, pins, "
                                f"max_steps, policy, recipe_file, gemm, seed, {', '.join(_PRECISION_KEYS)})")
        budget = _number("budget", budget)
        max_steps = _integer("max_steps", max_steps, 1)
        seed = _integer("seed", seed, 0)
        grad_scale = _number("grad_scale", grad_scale)
        if "gemm_times" in precision and isinstance(precision["gemm_times"], os.PathLike):
            precision["gemm_times"] = os.fspath(precision["gemm_times"])
        if not (math.isfinite(grad_scale) and grad_scale > 0):
            raise PlanError(f"snip.Controller: grad_scale: expected a finite number > 0, got {grad_scale!r}")
        if isinstance(options, str):
            options = [o.strip() for o in options.split(",")]
        if not isinstance(options, (list, tuple)) or not all(isinstance(o, str) for o in options):
            raise PlanError(f"snip.Controller: options: expected a list of option names, got {options!r}")
        options = list(options)
        if pins is not None and not (isinstance(pins, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                    for k, v in pins.items())):
            raise PlanError(f"snip.Controller: pins: expected a dict glob -> option (strings), got {pins!r}")
        for name, v in (("policy", policy), ("gemm", gemm)):
            if not isinstance(v, str):
                raise PlanError(f"snip.Controller: {name}: expected a string, got {v!r}")
        if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
            raise PlanError(f"snip.Controller: run_dir: expected a path, got {run_dir!r}")
        if roles is not None and not (callable(roles) or isinstance(roles, dict)):
            raise PlanError(f"snip.Controller: roles: expected a dict fqn -> role or fn(fqn) -> role, got {roles!r}")
        if module_filter_fn is not None and not callable(module_filter_fn):
            raise PlanError(f"snip.Controller: module_filter_fn: expected fn(module, fqn) -> bool, got "
                            f"{module_filter_fn!r}")
        precision = {k: _plain(k, v) for k, v in precision.items()}
        self._recipes = load_recipes(recipe_file) if recipe_file is not None else {}
        if "low_option" not in precision:
            low = next((o for o in options if o != "bf16" and _is_4bit(o, self._recipes)), None)
            if low is not None:
                precision["low_option"] = low
        if policy.startswith("uniform-") and "warmup_steps" not in precision:
            precision.setdefault("warmup_steps", 0)
            precision.setdefault("final_high_precision_fraction", 0.0)
        self.model = model
        self.optimizer = optimizer
        self.grad_scale = grad_scale
        self.seed = seed
        self.gemm = gemm

        # The layers, one per module, in registration order (the forward
        # order: checked at the first stats step).
        if module_filter_fn is None:
            head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

            def module_filter_fn(module, fqn):
                return module is not head and fqn.rpartition(".")[2] != "lm_head"
        found, seen, index, position = [], set(), {}, 0
        for fqn, m in _linears(model):
            if id(m) in seen:
                continue
            seen.add(id(m))
            accepted = module_filter_fn(m, fqn)
            if accepted:
                found.append((fqn, m))
            if accepted or isinstance(m, snip_nn.Linear):
                index[id(m)] = position  # the `layer` snip.convert will give it
                position += 1
        if not found:
            raise ConvertError(f"snip.Controller: no linear layer of {type(model).__name__} matched "
                               f"({len(_linears(model))} found)")
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for n, m in found:
            if id(m.weight) not in owned:
                raise Error(f"snip.Controller: layer '{n}': its weight is not a parameter of the optimizer")
            if not m.weight.requires_grad:
                raise Error(f"snip.Controller: layer '{n}': its weight does not require grad (a frozen layer has "
                            f"no weight divergence: leave it out with module_filter_fn)")
        role_of = roles if callable(roles) else (roles.get if isinstance(roles, dict) else hf_role)
        self.roles = {n: role_of(n) for n, _ in found}
        for n, r in self.roles.items():
            if r is not None and not isinstance(r, str):
                raise PlanError(f"snip.Controller: roles: layer '{n}': expected a role name (str) or None, got {r!r}")
        # Every option a layer may be given must run in snip.nn.Linear (the
        # operators' own rule refuses delayed scaling and error feedback);
        # an unknown name is the C++ configuration check's, below.
        for o in sorted({*options, precision.get("warmup_precision", "bf16"), precision.get("final_precision", "fp8"),
                         policy[len("uniform-"):] if policy.startswith("uniform-") else "bf16"} - {"bf16"}):
            r = self._recipes.get(o) or all_recipes().get(o)
            if r is not None:
                try:
                    _ops.check_runnable(recipe_arg(r))
                except RecipeError as e:
                    raise RecipeError(f"snip.Controller: option '{o}': {e}") from None

        cfg = [f"[train]\nmax_steps = {max_steps}\nseed = {seed}\n"
               f"gemm_dtype = {_toml_value('gemm', gemm)}\n", "[precision]",
               f"policy = {_toml_value('policy', policy)}", f"budget = {_toml_value('budget', budget)}",
               f"options = {_toml_value('options', options)}",
               f"pins = {_toml_value('pins', [f'{k}={v}' for k, v in (pins or {}).items()])}"]
        if recipe_file is not None:
            cfg.append(f"recipe_file = {_toml_value('recipe_file', str(recipe_file))}")
        for k, v in precision.items():
            cfg.append(f"{k} = {_toml_value(k, v)}")
        shapes = [{"name": n, "index": index[id(m)], "in": m.in_features, "out": m.out_features} for n, m in found]
        try:
            self._core = torch.classes.snip.Controller("\n".join(cfg) + "\n", json.dumps(shapes), gemm, grad_scale)
        except (ValueError, RuntimeError) as e:
            text = str(e).strip().splitlines()
            line = (text[0] if text else type(e).__name__).replace("snip.Controller: precision.", "precision.")
            raise PlanError(f"snip.Controller: {line}") from None
        # budget_unit = "time" or a gemm_times table (the C++ controller's
        # rule, as snip train's): the table, or a calibration on the layers'
        # device; the budget's feasibility is checked here, before the model
        # changes.
        if self._core.needs_gemm_times():
            if tokens is None:
                raise PlanError("snip.Controller: tokens: expected the rows per micro-batch (batch x seq_len) with "
                                "budget_unit='time' or gemm_times (the GEMM shapes the table times), got None")
            tokens = _integer("tokens", tokens, 1)
            micro_batches = _integer("micro_batches", micro_batches, 1)
            dev = next((m.weight.device for _, m in found if m.weight is not None), torch.device("cpu"))
            try:
                self._core.set_gemm_times(tokens, float(micro_batches), str(dev), bool(verbose))
            except (ValueError, RuntimeError) as e:
                text = str(e).strip().splitlines()
                raise PlanError(f"snip.Controller: {text[0] if text else type(e).__name__}") from None
        self._so = json.loads(self._core.stats_options())
        self._dist = _world() > 1
        self._rank = torch.distributed.get_rank() if self._dist else 0
        if run_dir is not None and self._rank == 0:
            try:
                os.makedirs(run_dir, exist_ok=True)
            except OSError as e:
                raise PlanError(f"snip.Controller: run_dir {run_dir}: cannot create it ({e.strerror})") from None
            self._core.set_output(str(run_dir), bool(verbose))
        elif verbose and self._rank == 0:
            self._core.set_output("", True)
        # Now the model changes (snip.convert: all or nothing).
        chosen = {n for n, _ in found}
        convert(model, recipe="none", gemm=gemm, seed=seed, module_filter_fn=lambda m, fqn: fqn in chosen)
        mods = dict(model.named_modules(remove_duplicate=False))
        self.layer_names = [n for n, _ in found]
        self.layers = [mods[n] for n in self.layer_names]
        assert [m.layer for m in self.layers] == [sh["index"] for sh in shapes]
        self.step = 0
        self._event, self._decided = {}, False
        self._begun = None  # the step whose begin_step ran, until end_step
        self._plan_step = None
        self._plan_phase = None

    # ---- the loop

    def begin_step(self, loss_fn):
        """Call at the start of every optimizer step, before its first
        forward. At a decision step (the end of warmup, each plan step, the
        start of the final phase) it runs the stats step when one is due
        (``loss_fn()``, a deterministic forward of the step's first
        micro-batch returning the scalar loss without calling backward, is
        then called 2 + K times, K = precision.curvature_probes; the
        controller runs their backwards) and sets every layer's recipe.
        Returns the step's metrics (dict; see metrics()). Every rank must
        call it at the same steps, once per step (then end_step). Raises
        snip.PlanError for an infeasible re-plan, non-finite statistics or
        ranks whose plans differ, snip.Error when begin_step runs twice for
        one step, when torch.distributed's world changed since the
        controller was built, or when loss_fn leaves a layer out (on every
        rank when one rank fails)."""
        s = self.step
        if self._begun == s:
            raise Error(f"snip.Controller: begin_step ran twice for step {s}; call end_step after the optimizer step "
                        "(once per optimizer step, not per micro-batch)")
        if (_world() > 1) != self._dist:
            raise Error("snip.Controller: torch.distributed's world changed since the controller was built; build "
                        "it after init_process_group")
        buf, t0 = torch.zeros(0, dtype=torch.float64), time.perf_counter()
        if self._core.stats_due(s):
            buf = self._measure(loss_fn, s)
        ev = json.loads(_check_call(self._core.begin_step, s, buf, time.perf_counter() - t0))
        self._event, self._decided = ev["metrics"], ev["decided"]
        self._begun = s
        if ev["decided"]:
            self._install(s)
        return self.metrics()

    def end_step(self):
        """Call after the optimizer step: counts it (stochastic rounding's
        key, the schedule's position)."""
        self.step += 1
        self._begun, self._event, self._decided = None, {}, False
        for m in self.layers:
            m.step = self.step

    # ---- what it decided

    @property
    def plan(self):
        """The decision in force (a snip.Plan), None before the first."""
        a = json.loads(self._core.assignment())
        if not a:
            return None
        pj = json.loads(self._core.last_plan())
        return Plan(a, pj, self._core.plan_table(), self._core.fp4_share(), self._plan_step, self._plan_phase)

    @property
    def schedule(self):
        """dict: max_steps, warmup_end (first plan step), final_start (first
        step of the final phase), plan_steps (list), policy."""
        return json.loads(self._core.schedule())

    def fp4_share(self):
        """The FP4 FLOPs share of the decision in force (fraction; 0 before the first)."""
        return self._core.fp4_share()

    def stats(self):
        """The smoothed statistics the last plan used, as RUN/stats/step-s.json
        holds them (dict: layers with flops, q, rel_err, details), or None."""
        return json.loads(self._core.smoothed())

    def metrics(self):
        """Numbers for your logger (dict): step (optimizer steps done),
        phase (of the step about to run), fp4_share, decided (whether this
        step's begin_step decided), fp4_share_by_role {role: fraction of that
        role's FLOPs at the low option}, rel_err_fprop {layer: relative fprop
        error of its option at the last stats step}; at a decision also the
        C++ controller's plan_step, precision (the assignment),
        stats_seconds, plan_status and plan_solve_seconds."""
        out = {"step": self.step, "phase": self._core.phase_at(self.step), "fp4_share": self._core.fp4_share(),
               "decided": self._decided}
        out.update({k: v for k, v in self._event.items() if k not in ("phase", "rel_err_fprop")})
        a = json.loads(self._core.assignment())
        if a:
            pj = json.loads(self._core.last_plan()) or {}
            tot, low = {}, {}
            for n, m in zip(self.layer_names, self.layers):
                r = self.roles.get(n) or "other"
                f = float(m.in_features * m.out_features)
                tot[r] = tot.get(r, 0.0) + f
                low[r] = low.get(r, 0.0) + f * sum(self._option(a, n, g) == self._so["low_option"]
                                                   for g in _GEMMS) / 3.0
            out["fp4_share_by_role"] = {r: low[r] / tot[r] for r in tot}
            if pj.get("rel_err_fprop"):
                out["rel_err_fprop"] = {n: pj["rel_err_fprop"][n].get(self._option(a, n, "fprop"), 0.0)
                                        for n in self.layer_names if n in pj["rel_err_fprop"]}
        return out

    # ---- checkpoints

    def state_dict(self):
        """Everything a resumed run needs to decide as this one would: the
        step, phase, decision, smoothed statistics and the guard's levers,
        and the layers it was made for (a dict of plain values; save it
        with the model and optimizer)."""
        return {"step": self.step, "plan_step": self._plan_step, "plan_phase": self._plan_phase,
                "layers": self._shapes(), "controller": json.loads(self._core.state())}

    def load_state_dict(self, state):
        """Restores state_dict()'s output and installs its decision on the
        layers. Raises snip.PlanError, changing nothing, for a malformed
        state or one made for other layers (names or shapes)."""
        if not isinstance(state, dict) or not {"controller", "step", "layers"} <= set(state):
            raise PlanError("snip.Controller.load_state_dict: expected a dict from Controller.state_dict()")
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or not 0 <= int(step) < 2 ** 32:
            raise PlanError(f"snip.Controller.load_state_dict: step: expected an integer in [0, 2^32), got {step!r}")
        if state["layers"] != self._shapes():
            theirs = state["layers"] if isinstance(state["layers"], list) else []
            diff = next((f"{t} vs {m}" for t, m in zip(theirs, self._shapes()) if t != m),
                        f"{len(theirs)} layers vs {len(self.layers)}")
            raise PlanError(f"snip.Controller.load_state_dict: the state is for other layers ({diff})")
        _check_call(self._core.restore, json.dumps(state["controller"]), what="snip.Controller.load_state_dict: ")
        self.step = int(step)
        self._plan_step, self._plan_phase = state.get("plan_step"), state.get("plan_phase")
        self._begun, self._event, self._decided = None, {}, False
        for m in self.layers:
            m.step = self.step
        if json.loads(self._core.assignment()):
            self._install(self._plan_step, count=False)

    # ---- internals

    def _shapes(self):
        return [[n, m.in_features, m.out_features] for n, m in zip(self.layer_names, self.layers)]

    @staticmethod
    def _option(a, name, gemm):
        return a[name] if name in a else a[f"{name}:{gemm}"]

    def _recipe_of(self, option):
        if option == "bf16":
            return "none"
        return self._recipes.get(option, option)

    def _install(self, s, count=True):
        a = json.loads(self._core.assignment())
        if self._dist:
            # Every rank decided from the same summed statistics; rank 0's
            # decision is the run's, and if any rank's differs, every rank stops.
            mine = json.dumps(a, sort_keys=True)
            root = [mine]
            torch.distributed.broadcast_object_list(root, src=0)
            differ = torch.tensor([int(root[0] != mine)], dtype=torch.int64, device=self._device())
            torch.distributed.all_reduce(differ)
            if int(differ) > 0:
                raise PlanError(f"snip.Controller: step {s}: {int(differ)} rank(s) decided another plan than rank 0 "
                                f"(this is rank {self._rank})")
        recipes = []
        for n in self.layer_names:
            by_gemm = {g: self._option(a, n, g) for g in _GEMMS}
            if len(set(by_gemm.values())) == 1:
                recipes.append(self._recipe_of(by_gemm["fprop"]))
            else:  # precision.granularity = "gemm": each GEMM its option
                recipes.append(per_gemm({g: self._recipe_of(o) for g, o in by_gemm.items()}))
        for m, r in zip(self.layers, recipes):
            m.set_recipe(r, gemm=self.gemm)
        if count:
            self._plan_step, self._plan_phase = s, self._core.phase_at(s)

    def _device(self):
        return self.layers[0].weight.device

    def _adam(self, w):
        """[m, v, vmax] and [step, lr, beta1, beta2, eps, amsgrad] of ``w`` in
        the optimizer (float32 for a float16 weight, whose eps underflows)."""
        group = next(g for g in self.optimizer.param_groups if any(p is w for p in g["params"]))
        st = self.optimizer.state.get(w, {})
        empty = torch.zeros(0, device=w.device)
        t = [st.get(k, empty).detach() for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")]
        if w.dtype == torch.float16:
            t = [x.float() for x in t]
        b1, b2 = group["betas"]
        nums = [float(st.get("step", 0)), float(group["lr"]), float(b1), float(b2), float(group["eps"]),
                1.0 if group.get("amsgrad", False) else 0.0]
        return t, nums

    def _weight(self, m):
        w = m.weight.detach()
        return w.float() if w.dtype == torch.float16 else w

    def _run_pass(self, loss_fn, what, probes):
        """One pass: loss_fn() and the backward to the layers' weights,
        with ``probes`` on the layers. Returns this rank's error (or None)."""
        for m, p in zip(self.layers, probes):
            m._probe = p
        try:
            with torch.enable_grad():
                loss = loss_fn()
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
                    raise Error(f"snip.Controller: loss_fn ({what}): expected a scalar loss tensor that requires "
                                f"grad, got {type(loss).__name__ if not isinstance(loss, torch.Tensor) else list(loss.shape)}")
                try:
                    torch.autograd.grad(loss.reshape(()), [m.weight for m in self.layers], allow_unused=True)
                except RuntimeError as e:
                    raise Error(f"snip.Controller: loss_fn ({what}): its backward failed ({str(e).splitlines()[0]}); "
                                "loss_fn must return the loss without calling backward") from None
        except Exception as e:  # noqa: BLE001 - agreed with the other ranks, then raised
            return e
        finally:
            for m in self.layers:
                m._probe = None
        for n, p in zip(self.layer_names, probes):
            if p.error is not None:
                e = p.error
                if not isinstance(e, Error):
                    e = PlanError(f"snip.Controller: stats step ({what}): layer '{n}': "
                                  f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}")
                return e
        return None

    def _agree(self, s, what, error, missing):
        """After a pass: every rank learns whether any failed or missed a
        layer, and each raises (its own error, or one naming another rank)
        instead of waiting for the others in the next collective."""
        bad = torch.tensor([int(error is not None), int(bool(missing))], dtype=torch.int64, device=self._device())
        if self._dist:
            torch.distributed.all_reduce(bad)
        if error is not None:
            raise error
        if missing:
            hint = (" (reentrant activation checkpointing hides weights from the stats step's backward: use "
                    "use_reentrant=False)" if what == "pass A" else "")
            raise Error(f"snip.Controller: stats step at step {s} ({what}): layer '{missing[0]}' took no part in "
                        f"loss_fn's forward and backward (every controlled layer must){hint}")
        if int(bad.sum()) > 0:
            raise Error(f"snip.Controller: stats step at step {s} ({what}): another rank failed or missed a layer "
                        "(its own error is in its output)")

    def _measure(self, loss_fn, s):
        """The stats step's passes (src/method/stats.h): A measures every
        option on the clean operands, C calibrates the upstream weight
        divergence, B the curvature; returns the [L·F + 1] float64 sums,
        summed over the ranks."""
        core, L = self._core, len(self.layers)
        K = self._so["curvature_probes"]
        fx, fg, fc, fu = (self._so[k] for k in ("dx_field", "group_field", "curvature_field", "calibration_field"))
        adam = [self._adam(m.weight) for m in self.layers]
        rec = [dict() for _ in range(L)]
        order = []  # layers in the order their forward ran

        def on_dy_a(i, probe):
            def f(dy):
                sums, row_rms, edg, dw = core.measure_layer(i, probe.x, dy, self._weight(self.layers[i]),
                                                            adam[i][0], adam[i][1], self.seed, s)
                rec[i].update(sums=sums, row_rms=row_rms, edg=edg, dw=dw, T=probe.x.shape[0])
                probe.x = None
            return f
        probes = [_Probe(keep_x=True) for _ in range(L)]
        for i, p in enumerate(probes):
            p.on_dy = on_dy_a(i, p)
            p.index, p.order = i, order
        error = self._run_pass(loss_fn, "pass A", probes)
        twice = next((self.layer_names[i] for i, p in enumerate(probes) if p.calls > 1), None)
        if twice is not None:
            error = Error(f"snip.Controller: stats step at step {s}: layer '{twice}' ran {probes[self.layer_names.index(twice)].calls} "
                          "times in one forward; the stats step measures layers that run once per forward (leave it "
                          "out with module_filter_fn)")
        if error is None and order != sorted(order):
            k = next(j for j in range(1, len(order)) if order[j] < order[j - 1])
            error = Error(f"snip.Controller: layers are not registered in forward order: '{self.layer_names[order[k]]}' "
                          f"ran after '{self.layer_names[order[k - 1]]}' but is registered before it (the upstream "
                          "sets follow the registration order; register the modules in the order they run)")
        self._agree(s, "pass A", error, [n for n, r in zip(self.layer_names, rec) if "sums" not in r])
        # Groups (layers reading the same input tensor: q/k/v, gate/up) and
        # the upstream sets U(l) = earlier layers of another group.
        group = []
        for i in range(L):
            group.append(next(k for k in range(i + 1) if probes[k].x_id == probes[i].x_id))
            rec[i]["sums"][fg] = float(group[i])
            rec[i]["upstream"] = any(group[k] != group[i] for k in range(i))
        for p in probes:
            p.x_keep = None
        # Pass C: relative noise on dX of every layer with an upstream layer.
        probes = [_Probe(keep_x=True) for _ in range(L)]
        for i, p in enumerate(probes):
            w = self.layers[i].weight

            def on_dy_c(dy, i=i, p=p):
                rec[i]["sums"][fu] = core.calibration_du_sq(p.x, dy, rec[i]["dw"], adam[i][0], adam[i][1])
                rec[i]["calibrated"] = True
                p.x = None
            p.on_dy = on_dy_c
            if rec[i]["upstream"]:
                like = torch.empty(0, dtype=self._weight(self.layers[i]).dtype, device=w.device)
                p.input_noise = (lambda i=i, like=like: core.calibration_noise(i, rec[i]["T"], rec[i]["sums"][fx],
                                                                               like, s))
        error = self._run_pass(loss_fn, "calibration", probes)
        self._agree(s, "calibration", error, [n for n, r in zip(self.layer_names, rec) if not r.get("calibrated")])
        for r in rec:
            r.pop("dw", None)
        # Pass B: per curvature probe, output noise ε on every layer.
        for k in range(K):
            probes = [_Probe() for _ in range(L)]
            for i, p in enumerate(probes):
                def noise(i=i, k=k):
                    return core.curvature_noise(i, k, rec[i]["row_rms"], s)

                def on_dy_b(dy, i=i, k=k, noise=noise):
                    eps = noise()
                    inner = (eps * dy.reshape(eps.shape)).sum(dtype=torch.float64)
                    rec[i]["sums"][fc] = rec[i]["sums"][fc] + inner - rec[i]["edg"][k]
                    rec[i]["probed"] = k + 1
                p.output_noise, p.on_dy = noise, on_dy_b
            error = self._run_pass(loss_fn, "curvature probe", probes)
            self._agree(s, "curvature probe", error,
                        [n for n, r in zip(self.layer_names, rec) if r.get("probed") != k + 1])
        buf = torch.cat([r["sums"] for r in rec] + [torch.ones(1, dtype=torch.float64, device=rec[0]["sums"].device)])
        if self._dist:
            torch.distributed.all_reduce(buf)
        return buf


_GEMMS = ("fprop", "dgrad", "wgrad")


def _is_4bit(option, file_recipes):
    """Whether recipe ``option`` has an operand of fewer than 8 element bits."""
    r = file_recipes.get(option) or all_recipes().get(option)
    if r is None:
        return False
    bits = {f["name"]: f["bits"] for f in formats()}
    return any(bits.get(spec.get("element"), 8) < 8 for spec in r.operands.values())
