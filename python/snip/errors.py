"""The exceptions of the snip package: one line naming what and where.

Every error snip raises on bad input is a ``snip.Error``; the subclasses
also derive from the built-in exception a caller would catch otherwise.
"""


class Error(Exception):
    """Base class of every error snip raises on bad input."""


class RecipeError(Error, ValueError):
    """An unknown recipe or operand name, a malformed recipe or recipe file,
    a recipe the Python operators cannot run (delayed scaling, error
    feedback), a tensor of an unsupported dtype or shape."""


class DeviceError(Error, RuntimeError):
    """A tensor on a device snip has no kernel for (fake_quant and snip.nn.Linear:
    CPU and CUDA; quantize/dequantize: CPU), or tensors on different devices."""


class ConvertError(Error, ValueError):
    """``snip.convert`` matched no ``nn.Linear``, or a plan names a module
    that is not one."""


class PlanError(Error, ValueError):
    """``snip.Controller`` cannot plan: a bad [precision] option, a budget the
    pins make infeasible, non-finite statistics, ranks that disagree."""
