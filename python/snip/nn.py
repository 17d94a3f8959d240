"""``snip.nn.Linear``: a drop-in for ``torch.nn.Linear`` whose three GEMMs
run quantized by a recipe (docs/python.md).

For x [..., IN] and weight W [OUT, IN], with N = the product of x's leading
dimensions:

    fprop  Y  = Q(X) · Q(W)ᵀ        X [N, IN]                 K = IN
    dgrad  dX = Q(dY) · Q(Wᵀ)ᵀ      dY [N, OUT], Wᵀ [IN, OUT]  K = OUT
    wgrad  dW = Q(dYᵀ) · Q(Xᵀ)ᵀ     dYᵀ [OUT, N], Xᵀ [IN, N]  K = N

Q is the recipe's spec for that operand, blocks along the GEMM's reduction
dimension K; the GEMM runs in ``gemm`` ("bf16": BF16 inputs with FP32
accumulation, output rounded to BF16; "fp32"), and its output is cast back
to x's dtype. The bias (when present) is added unquantized after the GEMM.
The arithmetic is the C++ ``QuantLinear``'s (src/model/linear.cpp) bit for
bit; stochastic rounding draws from (seed, step, layer, operand), so a run
is reproducible.
"""

import torch

from . import _ops
from . import _probe
from .recipes import recipe_arg, recipe_name


_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _checked_int(value, what, limit):
    """int(value) when it is an integer in [0, limit); else snip.RecipeError."""
    if isinstance(value, bool) or not isinstance(value, int) and not (
            isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point()):
        raise _ops.RecipeError(f"snip.nn.Linear: {what}: expected an integer, got {type(value).__name__}")
    v = int(value)
    if not 0 <= v < limit:
        raise _ops.RecipeError(f"snip.nn.Linear: {what}: expected an integer in [0, {limit}), got {v}")
    return v


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` with quantized fprop/dgrad/wgrad.

    Args: ``in_features``, ``out_features``, ``bias``, ``device``, ``dtype``
    as torch.nn.Linear (float32, float64, bfloat16 or float16 parameters,
    CPU; the GEMMs' operands are quantized from float32 values, float64 when
    input and weight are float64, and the output has the input's dtype);
    ``recipe``: a recipe name ("fp8", "mxfp8", "nvfp4", "mxfp4", "fp4", ...
    from ``snip.recipes()``), a ``snip.Recipe``, or "none"/None (no
    quantization: the GEMMs in ``gemm`` only, as ``snip train``'s policy
    none); ``gemm``: "bf16" or "fp32"; ``seed``, ``layer``:
    integers >= 0 that key stochastic rounding. Attribute ``step`` (int,
    optimizer steps done) keys it too: advance it once per optimizer step
    (``snip.set_step``). Parameters and ``state_dict()`` keys are
    torch.nn.Linear's (``weight`` [OUT, IN], ``bias`` [OUT]).

    Raises snip.RecipeError for an unknown or unsupported recipe (at
    construction), snip.DeviceError for tensors neither on the CPU nor on a CUDA device,
    or on different devices.
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, recipe="fp8",
                 gemm="bf16", seed=0, layer=0):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._init_snip(recipe, gemm, seed, layer)

    def _init_snip(self, recipe, gemm, seed, layer):
        # step lives in a 0-d int64 buffer (not in state_dict): a compiled
        # graph reads it instead of recompiling for every step.
        self.register_buffer("_step", torch.zeros((), dtype=torch.int64), persistent=False)
        self._probe = None  # a stats-step probe of snip.Controller (controller.py), while it measures
        self.set_recipe(recipe, gemm=gemm)
        self.seed = seed
        self.layer = layer

    @property
    def recipe(self):
        """The recipe (a name, a snip.Recipe, or "none"); setting it is set_recipe(value)."""
        return self._recipe

    @recipe.setter
    def recipe(self, value):
        self.set_recipe(value)

    @property
    def seed(self):
        """Stochastic rounding's seed, an int in [0, 2^63)."""
        return self._seed

    @seed.setter
    def seed(self, value):
        self._seed = _checked_int(value, "seed", 2 ** 63)

    @property
    def layer(self):
        """This layer's index in stochastic rounding's key, an int in [0, 2^32)."""
        return self._layer

    @layer.setter
    def layer(self, value):
        self._layer = _checked_int(value, "layer", 2 ** 32)

    @property
    def step(self):
        """Optimizer steps done (int): stochastic rounding's key."""
        return int(self._step)

    @step.setter
    def step(self, value):
        self._step.fill_(_checked_int(value, "step", 2 ** 32))

    def set_recipe(self, recipe, gemm=None):
        """Changes the recipe (and GEMM dtype) from the next forward on.
        Raises snip.RecipeError when it is unknown or unsupported."""
        arg = recipe_arg(recipe)
        gemm = gemm if gemm is not None else getattr(self, "gemm", "bf16")
        if gemm not in ("bf16", "fp32"):
            raise _ops.RecipeError(f"gemm: expected bf16 or fp32, got {gemm!r}")
        _ops.check_runnable(arg)  # now, not at the first forward
        self._recipe = recipe if recipe is not None else "none"
        self._recipe_arg = arg
        self.gemm = gemm

    @classmethod
    def from_linear(cls, linear, *, recipe="fp8", gemm="bf16", seed=0, layer=0):
        """A snip.nn.Linear sharing ``linear``'s parameters (the same
        Parameter objects: an optimizer built before keeps working)."""
        m = cls.__new__(cls)
        torch.nn.Module.__init__(m)
        m.in_features, m.out_features = linear.in_features, linear.out_features
        m.weight = linear.weight
        m.bias = linear.bias
        m.training = linear.training
        # The hooks registered on `linear` keep firing on the layer that replaces it.
        # (_is_full_backward_hook decides whether _backward_hooks run at all;
        # the state_dict hooks keep a user's checkpoint code working.)
        for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                      "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
                      "_is_full_backward_hook", "_state_dict_hooks", "_state_dict_pre_hooks",
                      "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"):
            if hasattr(linear, hooks):
                setattr(m, hooks, getattr(linear, hooks))
        m._init_snip(recipe, gemm, seed, layer)
        return m

    def forward(self, x):
        _ops.check_tensor(x)
        _ops.check_device(x, self.weight, *([] if self.bias is None else [self.bias]), cuda=True)
        _ops.check_device(self._step, cuda=True)  # on the CPU or beside the weight
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise _ops.RecipeError(f"snip.nn.Linear: expected input [..., {self.in_features}], got {list(x.shape)}")
        for t, what in ((x, "input"), (self.weight, "weight")):
            if t.dtype not in _DTYPES:
                raise _ops.RecipeError(f"snip.nn.Linear: {what}: expected float32, float64, bfloat16 or float16, "
                                       f"got {t.dtype}")
        # The operators compute in float64 when input and weight both are,
        # else in float32 (bfloat16 and float16 values are float32 values:
        # the operands quantize as they are); the output has x's dtype, or
        # autocast's when it is on (as torch.nn.Linear's).
        work = torch.float64 if x.dtype == self.weight.dtype == torch.float64 else torch.float32
        dev = x.device.type
        out = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        x2 = x.reshape(-1, self.in_features).to(work)
        if self._probe is not None:  # snip.Controller's stats step: full precision, hooks
            y = _probe.probe_forward(self, x, x2)
            if self.bias is not None:
                y = y + self.bias.to(work)
            return y.to(out).view(*x.shape[:-1], self.out_features)
        y = _ops.ops.linear_fprop(x2, self.weight.to(work), self._recipe_arg, self._seed, self._step, self._layer,
                                  self.gemm)
        if self.bias is not None:
            y = y + self.bias.to(work)
        return y.to(out).view(*x.shape[:-1], self.out_features)

    def extra_repr(self):
        return f"{super().extra_repr()}, recipe={recipe_name(self.recipe)}, gemm={self.gemm}"
