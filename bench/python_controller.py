"""What snip.Controller costs in a Hugging Face loop: the training step of
examples/hf_llama_snip.py's model (a 4-layer Llama, hidden 128, vocabulary
512, 8 x 128 tokens) unquantized (the baseline, measured in the same run),
under SNIP's plan (NVFP4/FP8 GEMMs), and the stats step that a plan step adds
(begin_step at a plan step: the passes A, C and K = curvature_probes B on
one micro-batch, the reduction, the ILP), each the median of --repeats.

    .venv/bin/python bench/python_controller.py [--repeats 5] [--probes 1]

Prints milliseconds per step and each row's ratio to the unquantized step.
"""
import argparse
import statistics
import time

import torch
import transformers

import snip

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--repeats", type=int, default=5, help="timed steps per row (the median is reported)")
p.add_argument("--probes", type=int, default=1, help="precision.curvature_probes of the stats step")
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=128)
a = p.parse_args()

torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=a.seq,
                               tie_word_embeddings=False)
model = transformers.LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 512, (a.batch, a.seq), generator=torch.Generator().manual_seed(1))


def loss_fn():
    return model(ids, labels=ids).loss


def train_step():
    loss_fn().backward()
    opt.step()
    opt.zero_grad()


def median_ms(f, repeats):
    f()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


# A plan every step from step 1 on (warmup_steps 1, intervals of 1 step), so
# each begin_step at steps >= 1 runs a stats step and the ILP.
ctl = snip.Controller(model, opt, budget=0.75, options=("nvfp4", "fp8"), max_steps=10 ** 6, warmup_steps=1,
                      initial_interval=1, final_interval=1, curvature_probes=a.probes)
ctl.begin_step(loss_fn)  # step 0: warmup, every layer unquantized (bf16 GEMMs)
base = median_ms(train_step, a.repeats)
ctl.end_step()


def stats_step():
    ctl.begin_step(loss_fn)
    ctl.end_step()


stats = median_ms(stats_step, a.repeats)
planned = median_ms(train_step, a.repeats)  # under the last plan (NVFP4 share >= 0.75)
rows = [("training step, unquantized (bf16 GEMMs)", base), (f"training step under SNIP's plan (FP4 share "
        f"{ctl.fp4_share():.2f})", planned), (f"stats step (begin_step at a plan step, K = {a.probes})", stats)]
print(f"{a.batch} x {a.seq} tokens, {len(ctl.layers)} controlled layers, torch {torch.__version__}, "
      f"{torch.get_num_threads()} threads")
for name, ms in rows:
    print(f"{name:60s} {ms:9.1f} ms  {ms / base:5.2f}x")
