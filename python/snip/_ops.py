"""Loads snip's compiled custom operators (TORCH_LIBRARY(snip), src/python/ops.cpp)
and registers what PyTorch needs besides their CPU kernels: fake (meta)
kernels for torch.compile and the autograd formula of ``snip::linear_fprop``.

The library is the path in the environment variable ``SNIP_OPS_LIBRARY``
(the test suite points it at the build tree), else ``_snip_ops.so`` beside
this file (``pip install .``), else, for the package of a source checkout
(``pip install -e .``, or ``PYTHONPATH=python``), the checkout's
``build/python/_snip_ops.so``.
"""

import os
import pathlib

import torch

from .errors import DeviceError, RecipeError


def _library_path():
    env = os.environ.get("SNIP_OPS_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"snip: SNIP_OPS_LIBRARY={env}: no such file (build it: scripts/setup.sh)")
        return env
    here = pathlib.Path(__file__).resolve().parent
    found = sorted(here.glob("_snip_ops*.so"))
    if not found and here.parent.name == "python" and (here.parent.parent / "pyproject.toml").is_file():
        # The package of a source checkout (an editable install, or
        # PYTHONPATH=python): the operators of its CMake build folder.
        found = sorted((here.parent.parent / "build" / "python").glob("_snip_ops*.so"))
    if not found:
        raise ImportError(
            f"snip: {here}/_snip_ops.so is missing: install the package with "
            "`pip install --no-build-isolation .` from the repository (README), or set SNIP_OPS_LIBRARY"
        )
    return str(found[0])


torch.ops.load_library(_library_path())
ops = torch.ops.snip


def call(op, *args):
    """Runs custom operator ``op``; its ValueError (a snip::UserError) becomes
    a one-line snip.RecipeError."""
    try:
        return op(*args)
    except (ValueError, RuntimeError) as e:
        text = str(e).strip().splitlines()
        line = text[0] if text else type(e).__name__
        # A recipe file's read error names the option of `snip train`; here it is an argument.
        raise RecipeError(line.removeprefix("precision.recipe_file: ")) from None


def check_runnable(recipe_arg):
    """Raises snip.RecipeError when the operators cannot run ``recipe_arg``
    (what recipes.recipe_arg gives): unknown, or keeping state between calls
    (src/python/ops.cpp recipe_of). One tiny call resolves it."""
    call(ops.fake_quant, torch.zeros(1, 1), recipe_arg, "fprop.x", 0, 0, 0)


def check_tensor(x, what="x"):
    """Raises snip.RecipeError when ``x`` is not a torch.Tensor."""
    if not isinstance(x, torch.Tensor):
        raise RecipeError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")


def check_device(*tensors, cuda=False):
    """Raises snip.DeviceError for a tensor on a device the operator has no
    kernel for (the CPU always; CUDA when ``cuda``: fake_quant and the
    linear layer), or for tensors on different devices."""
    devices = {t.device for t in tensors}
    for t in tensors:
        if t.device.type == "cpu" or (cuda and t.device.type == "cuda"):
            continue
        where = "the CPU and CUDA" if cuda else "the CPU only (packed codes and scales live on the host)"
        raise DeviceError(f"snip: tensor on {t.device}: this snip operator has kernels for {where}; move it there")
    if len(devices) > 1:
        raise DeviceError(f"snip: tensors on {', '.join(sorted(str(d) for d in devices))}: expected one device")


@torch.library.register_fake("snip::fake_quant")
def _fake_quant_fake(x, recipe, operand, seed, step, layer):
    return x.new_empty(x.shape)  # contiguous, as the kernel's result


# fake_quant's gradient is the straight-through estimator: dL/dx = dL/dy
# (quantization is treated as the identity), as torchao's and TE's fake
# quantization do.
torch.library.register_autograd("snip::fake_quant", lambda ctx, dy: (dy, None, None, None, None, None))


@torch.library.register_fake("snip::linear_fprop")
def _linear_fprop_fake(x, w, recipe, seed, step, layer, gemm):
    return x.new_empty((x.shape[0], w.shape[0]))


@torch.library.register_fake("snip::linear_backward")
def _linear_backward_fake(dy, x, w, recipe, seed, step, layer, gemm, need_dx, need_dw):
    dx = dy.new_empty(x.shape) if need_dx else dy.new_empty((0,))
    dw = dy.new_empty(w.shape) if need_dw else dy.new_empty((0,))
    return dx, dw


def _linear_setup(ctx, inputs, output):
    x, w, recipe, seed, step, layer, gemm = inputs
    # The step at forward time: backward quantizes with the forward's key
    # even if the layer's step moves before it runs (as QuantLinear does).
    ctx.save_for_backward(x, w, step.clone())
    ctx.args = (recipe, seed, layer, gemm)


def _linear_backward(ctx, dy):
    x, w, step = ctx.saved_tensors
    recipe, seed, layer, gemm = ctx.args
    need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dx, dw = ops.linear_backward(dy.contiguous(), x, w, recipe, seed, step, layer, gemm, need_dx, need_dw)
    return (dx if need_dx else None), (dw if need_dw else None), None, None, None, None, None


torch.library.register_autograd("snip::linear_fprop", _linear_backward, setup_context=_linear_setup)
