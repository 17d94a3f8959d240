"""snip.nn.Linear against torch.nn.Linear, eager and under torch.compile, in
one run: forward + backward of one layer x [N, IN] -> [N, OUT] (the shapes
of a Llama MLP projection), best of --repeats timed calls after warm-up.

    .venv/bin/python bench/python_linear.py [--n 2048 --fin 1024 --fout 2816] [--compile]

Rows: torch.nn.Linear in FP32 and under BF16 autocast (the baselines), then
snip.nn.Linear with recipe none (BF16 GEMMs, as snip train's policy none)
and the quantizing recipes. Columns: milliseconds per forward+backward,
GFLOP/s (6 N IN OUT per step), and the ratio to torch.nn.Linear FP32 and to
torch's BF16 autocast. With --compile each row is also run under
torch.compile (Inductor; compilation not timed).
"""
import argparse
import time

import torch

import snip  # the package scripts/setup.sh installs into .venv

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--n", type=int, default=2048, help="rows (tokens) N")
p.add_argument("--fin", type=int, default=1024, help="in_features")
p.add_argument("--fout", type=int, default=2816, help="out_features")
p.add_argument("--repeats", type=int, default=10, help="timed calls per row (the best is reported)")
p.add_argument("--recipes", default="mxfp8,fp8,nvfp4,mxfp4", help="snip recipes to time, comma-separated")
p.add_argument("--compile", action="store_true", help="also time each row under torch.compile (Inductor)")
a = p.parse_args()

torch.manual_seed(0)
x0 = torch.randn(a.n, a.fin)
dy = torch.randn(a.n, a.fout)
flops = 6.0 * a.n * a.fin * a.fout


def timed(layer, autocast=False):
    x = x0.clone().requires_grad_(True)

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            y = layer(x)
        y.backward(dy.to(y.dtype))
        layer.zero_grad(set_to_none=True)
        x.grad = None

    for _ in range(2):
        step()
    best = float("inf")
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return best


rows = [("torch.nn.Linear fp32", lambda: torch.nn.Linear(a.fin, a.fout, bias=False), False),
        ("torch.nn.Linear bf16 autocast", lambda: torch.nn.Linear(a.fin, a.fout, bias=False), True),
        ("snip none (BF16 GEMM)", lambda: snip.nn.Linear(a.fin, a.fout, bias=False, recipe="none"), False)]
for r in a.recipes.split(","):
    rows.append((f"snip {r}", lambda r=r: snip.nn.Linear(a.fin, a.fout, bias=False, recipe=r), False))

print(f"snip {snip.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
      f"N={a.n} IN={a.fin} OUT={a.fout}, best of {a.repeats}")
print(f"{'layer':34} {'mode':8} {'ms':>9} {'GFLOP/s':>9} {'vs fp32':>8} {'vs bf16':>8}")
base = {}
for name, make, autocast in rows:
    for mode in ("eager", "compile") if a.compile else ("eager",):
        torch.manual_seed(0)
        layer = make()
        if mode == "compile":
            layer = torch.compile(layer)
        s = timed(layer, autocast)
        base.setdefault((name, mode), s)
        f32 = base.get(("torch.nn.Linear fp32", mode), s)
        b16 = base.get(("torch.nn.Linear bf16 autocast", mode), s)
        print(f"{name:34} {mode:8} {s * 1e3:9.2f} {flops / s / 1e9:9.1f} {s / f32:7.2f}x {s / b16:7.2f}x",
              flush=True)
