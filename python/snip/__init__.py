"""snip: adaptive, layer-wise FP4/FP8 mixed-precision training, from PyTorch.

    import snip
    y = snip.fake_quant(x, "mxfp4")                  # quantize-dequantize along the last dim
    layer = snip.nn.Linear(1024, 4096, recipe="nvfp4")
    snip.convert(model, recipe="fp8", module_filter_fn=lambda m, fqn: fqn != "lm_head")

Reference: docs/python.md. CPU kernels today; every error on bad input is a
one-line ``snip.Error``.
"""

__version__ = "0.1.0"

import typing as _typing

import torch

from . import _ops
from .errors import ConvertError, DeviceError, Error, PlanError, RecipeError
from .recipes import Recipe, formats, load_plan, load_recipes, per_gemm, recipe_arg as _recipe_arg
from .recipes import recipe_name as _recipe_name, recipes
from . import nn
from .convert import convert, precision_table, set_step
from .controller import Controller, Plan

OPERANDS = ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x")


def fake_quant(x, recipe, operand="fprop.x", *, seed=0, step=0, layer=0):
    """Quantizes ``x`` [..., K] (float32 or float64, on the CPU or a CUDA
    device: the same bits, docs/gpu.md) along its last
    dimension K with ``recipe``'s spec for ``operand`` (one of
    snip.OPERANDS; blocks run along K, as the GEMM's reduction dimension) and
    dequantizes it: a tensor of x's shape and dtype holding exactly the values
    the GEMM would see (before its BF16/FP32 cast). ``seed``, ``step`` and
    ``layer`` key stochastic rounding (integers >= 0).

    Raises snip.RecipeError (unknown recipe or operand, dtype, shape),
    snip.DeviceError (neither on the CPU nor on a CUDA device). Source:
    src/python/ops.cpp (formats/fake_quant.h, formats/fake_quant_cuda.h).
    """
    _ops.check_tensor(x)
    _ops.check_device(x, cuda=True)
    return _ops.call(_ops.ops.fake_quant, x, _recipe_arg(recipe), operand, int(seed), int(step), int(layer))


class QuantizedTensor(_typing.NamedTuple):
    """What ``snip.quantize`` returns: a tensor [rows, cols] as element codes
    and block scales (formats/fake_quant.h QuantizedTensor).

    data: uint8 [packed bytes], the codes of the row-major [rows, cols]
      input packed as PyTorch's float4_e2m1fn_x2 and TransformerEngine pack
      them (4-bit: element 2i in the low nibble of byte i; 5 to 8 bits: a
      byte each; more: 2 bytes little-endian).
    scale_codes: int64 [GR, GC], each block's stored scale (E8M0 or E4M3
      code, or the FP32 bits of an FP32 scale).
    scales: float32 [GR, GC], each block's decode scale, the tensor scale
      included (a value is decode(code) * scale).
    tensor_scale: float32 [2], NVFP4's second level (decode, encode); 1, 1
      for other rules.
    block: (block_rows, block_cols); shape: (rows, cols); recipe, operand:
      what quantized it.
    """
    data: torch.Tensor
    scale_codes: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor
    block: tuple
    shape: tuple
    recipe: object
    operand: str

    def __repr__(self):
        return (f"snip.QuantizedTensor(shape={self.shape}, recipe={_recipe_name(self.recipe)}, "
                f"operand={self.operand}, block={self.block}, data={self.data.numel()} bytes, "
                f"scales={list(self.scales.shape)})")


def quantize(x, recipe, operand="fprop.w", *, seed=0, step=0, layer=0):
    """Quantizes ``x`` [..., K] (float32, or float64 rounded to float32 first;
    CPU) along its last dimension with ``recipe``'s spec for ``operand`` to
    codes and scales: a snip.QuantizedTensor of shape [rows, K], rows = the
    product of the leading dimensions. ``dequantize(quantize(x))`` equals
    ``fake_quant(x)`` bit for bit (but for NaN inputs of NaN-less formats).
    Not traceable by torch.compile. Raises as fake_quant. Source:
    src/python/ops.cpp (formats/fake_quant.h quantize_packed)."""
    _ops.check_tensor(x)
    _ops.check_device(x)
    data, codes, scales, ts, block = _ops.call(_ops.ops.quantize, x, _recipe_arg(recipe), operand, int(seed),
                                               int(step), int(layer))
    rows = x.numel() // x.shape[-1] if x.dim() > 0 and x.shape[-1] > 0 else 0
    return QuantizedTensor(data, codes, scales, ts, tuple(block.tolist()), (rows, x.shape[-1]), recipe, operand)


def dequantize(q):
    """The float32 [rows, cols] tensor ``q`` (a snip.QuantizedTensor)
    stands for: each code decoded times its block's scale. Raises
    snip.RecipeError for sizes that do not fit the recipe's format."""
    if not isinstance(q, QuantizedTensor):
        raise RecipeError(f"dequantize: expected a snip.QuantizedTensor, got {type(q).__name__}")
    for name in ("data", "scales"):
        _ops.check_tensor(getattr(q, name), name)
    _ops.check_device(q.data, q.scales)
    if len(q.shape) != 2 or len(q.block) != 2 or not all(isinstance(v, int) for v in (*q.shape, *q.block)):
        raise RecipeError(f"dequantize: shape and block: expected two integers each, got {q.shape} and {q.block}")
    if not all(0 <= v < 2 ** 62 for v in (*q.shape, *q.block)):
        raise RecipeError(f"dequantize: shape and block: expected sizes in [0, 2^62), got {q.shape} and {q.block}")
    return _ops.call(_ops.ops.dequantize, q.data, q.scales, torch.tensor(q.block, dtype=torch.int64), q.shape[0],
                     q.shape[1], _recipe_arg(q.recipe), q.operand)


__all__ = [
    "__version__", "Error", "RecipeError", "DeviceError", "ConvertError", "PlanError", "Controller", "Plan", "Recipe", "OPERANDS",
    "formats", "recipes", "load_recipes", "per_gemm", "load_plan", "fake_quant", "QuantizedTensor", "quantize", "dequantize", "nn", "convert", "set_step", "precision_table",
]
