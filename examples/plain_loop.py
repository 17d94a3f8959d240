"""A plain PyTorch training loop with snip: a small Hugging Face Llama,
every projection but lm_head converted to a snip recipe (NVFP4 by default:
E2M1 elements in 1x16 blocks with E4M3 block scales), trained with AdamW on
the project's corpus (a data folder of `snip-data prepare`: the King James
Bible by default, scripts/run.sh makes it).

    python examples/plain_loop.py --data data/kjv --steps 200
    python examples/plain_loop.py --recipe none        # the same loop unquantized (BF16 GEMMs)

Prints the loss every --log steps and a summary line at the end:
"plain_loop: steps N, train loss first F -> last L (mean of 10 steps), val loss V".
"""
import argparse
import math
import os
import time

import torch
import transformers

import snip
import snip.data

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--data", default="data/kjv", help="data folder of snip-data prepare (train.bin, val.bin)")
p.add_argument("--recipe", default="nvfp4", help="recipe of every projection (snip.recipes()), or none")
p.add_argument("--steps", type=int, default=200, help="optimizer steps")
p.add_argument("--batch", type=int, default=8, help="sequences per step")
p.add_argument("--seq", type=int, default=128, help="tokens per sequence")
p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (cosine decay to 10%%)")
p.add_argument("--log", type=int, default=20, help="print the loss every this many steps")
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()
if not os.path.isfile(f"{a.data}/train.bin"):
    p.error(f"--data {a.data}: no train.bin there (scripts/run.sh prepares data/kjv; any folder of "
            "`snip-data prepare` will do)")

train = snip.data.read_tokens(f"{a.data}/train.bin")
val = snip.data.read_tokens(f"{a.data}/val.bin")
torch.manual_seed(a.seed)
cfg = transformers.LlamaConfig(vocab_size=snip.data.vocab_size(a.data), hidden_size=128, intermediate_size=344,
                               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=a.seq, tie_word_embeddings=False)
model = transformers.LlamaForCausalLM(cfg)

# The one line snip adds: every nn.Linear but lm_head runs its GEMMs quantized.
snip.convert(model, recipe=a.recipe, module_filter_fn=lambda module, fqn: fqn != "lm_head")

opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.45 * (1 + math.cos(math.pi * s / a.steps)))
gen = torch.Generator().manual_seed(a.seed)


def batch(tokens):
    starts = torch.randint(0, len(tokens) - a.seq - 1, (a.batch,), generator=gen)
    return torch.stack([tokens[s:s + a.seq] for s in starts.tolist()])


losses, t0 = [], time.time()
for step in range(a.steps):
    ids = batch(train)
    loss = model(ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    snip.set_step(model, step + 1)  # stochastic rounding's key: one per optimizer step
    losses.append(loss.item())
    if (step + 1) % a.log == 0 or step + 1 == a.steps:
        tok_s = (step + 1) * a.batch * a.seq / (time.time() - t0)
        print(f"step {step + 1}/{a.steps}  loss {loss.item():.4f}  {tok_s:,.0f} tok/s", flush=True)

model.eval()
with torch.no_grad():
    vids = batch(val)
    val_loss = model(vids, labels=vids).loss.item()
n = min(10, len(losses))
print(f"plain_loop: steps {a.steps}, train loss first {sum(losses[:n]) / n:.4f} -> last "
      f"{sum(losses[-n:]) / n:.4f} (mean of {n} steps), val loss {val_loss:.4f}, recipe {a.recipe}")
