"""The stats step's probes on snip.nn.Linear (snip.Controller, controller.py):
what src/model/linear.h's LinearProbe does for the C++ QuantLinear."""

import torch


class Probe:
    """One layer's hooks during one pass of the stats step: full-precision
    GEMMs (Y = X·Wᵀ in X's working dtype, float32 or float64, autocast off),
    the input kept (``keep_x``: pass A, C), noise added to the output
    (``output_noise``: pass B) or to dX (``input_noise``: pass C), and
    ``on_dy`` called with dL/dY in the layer's backward. ``x_id`` names the
    layer's input tensor (storage, shape, dtype); ``x_keep`` holds that
    tensor until the pass's caller has compared the ids, so no other input
    can take its memory meanwhile. ``calls`` counts forwards; ``order``
    (when set) gets ``index`` appended at the first."""

    def __init__(self, keep_x=False, output_noise=None, input_noise=None, on_dy=None):
        self.keep_x = keep_x
        self.output_noise = output_noise
        self.input_noise = input_noise
        self.on_dy = on_dy
        self.x = None
        self.x_id = None
        self.x_keep = None
        self.error = None
        self.calls = 0
        self.index = None
        self.order = None


class _ProbeLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, probe):
        with torch.autocast(x2.device.type, enabled=False):
            y = torch.mm(x2, w.to(x2.dtype).t())
            if probe.output_noise is not None:
                y = y + probe.output_noise().to(y.dtype)
        ctx.save_for_backward(w)
        ctx.probe = probe
        ctx.x_dtype = x2.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        (w,) = ctx.saved_tensors
        probe = ctx.probe
        dy = dy.detach().to(ctx.x_dtype)
        if probe.on_dy is not None and probe.error is None:
            try:
                probe.on_dy(dy)
            except Exception as e:  # noqa: BLE001 - raised after the pass, outside autograd
                probe.error = e
        with torch.autocast(dy.device.type, enabled=False):
            dx = torch.mm(dy, w.detach().to(ctx.x_dtype))
            if probe.input_noise is not None:
                dx.add_(probe.input_noise())
        return dx, None, None


def probe_forward(layer, x, x2):
    """snip.nn.Linear's forward while a stats-step probe is installed:
    Y = X·Wᵀ in x2's dtype, no quantization (x [..., IN] the layer's input,
    x2 [N, IN] its working copy, float32 or float64)."""
    probe = layer._probe
    probe.calls += 1
    if probe.calls == 1 and probe.order is not None:
        probe.order.append(probe.index)
    if probe.keep_x:
        probe.x = x2.detach()
    if probe.order is not None:  # pass A: which input tensor (siblings share one)
        probe.x_id = (x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape), tuple(x.stride()), x.dtype)
        probe.x_keep = x.detach()
    return _ProbeLinear.apply(x2, layer.weight, probe)
