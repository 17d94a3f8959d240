"""The stats step's probes on snip.nn.Linear (snip.Controller, controller.py):
what src/model/linear.h's LinearProbe does for the C++ QuantLinear."""

import torch


class Probe:
    """One layer's hooks during one pass of the stats step (the
    LinearProbe of src/model/linear.h): full-precision GEMMs, the input
    kept (pass A, C), noise added to the output (B) or to dX (C), and
    ``on_dy`` called with dL/dY in the layer's backward."""

    def __init__(self, keep_x=False, output_noise=None, input_noise=None, on_dy=None):
        self.keep_x = keep_x
        self.output_noise = output_noise
        self.input_noise = input_noise
        self.on_dy = on_dy
        self.x = None
        self.x_id = None
        self.error = None


class _ProbeLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, probe):
        y = torch.mm(x2, w.to(x2.dtype).t())
        if probe.output_noise is not None:
            y = y + probe.output_noise()
        ctx.save_for_backward(w)
        ctx.probe = probe
        ctx.x_dtype = x2.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        (w,) = ctx.saved_tensors
        probe = ctx.probe
        dy = dy.detach()
        if probe.on_dy is not None and probe.error is None:
            try:
                probe.on_dy(dy)
            except Exception as e:  # noqa: BLE001 - re-raised after the pass, outside autograd
                probe.error = e
        dx = torch.mm(dy, w.detach().to(ctx.x_dtype))
        if probe.input_noise is not None:
            dx.add_(probe.input_noise())
        return dx, None, None


def probe_forward(layer, x, x2):
    """snip.nn.Linear's forward while a stats-step probe is installed:
    Y = X·Wᵀ in X's dtype, no quantization (x [..., IN] the layer's input,
    x2 [N, IN] its working copy)."""
    probe = layer._probe
    if probe.keep_x:
        probe.x = x2.detach()
        probe.x_id = (x.data_ptr(), tuple(x.shape), x.dtype)
    return _ProbeLinear.apply(x2, layer.weight, probe)
