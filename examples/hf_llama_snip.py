"""SNIP in a Hugging Face training loop: a randomly initialised
transformers.LlamaForCausalLM, trained with AdamW on the project's corpus (a
data folder of `snip-data prepare`; scripts/run.sh makes data/kjv), while
snip.Controller measures every projection's sensitivity and re-plans its
precision (NVFP4 or FP8) under a budget of 75% of the FLOPs in NVFP4.

    python examples/hf_llama_snip.py --data data/kjv --steps 300
    python examples/hf_llama_snip.py --budget 0.9 --run-dir runs/hf   # also writes plans/ and stats/ there

Prints each decision (warmup, each re-plan, the final FP8 phase), the table
of the last re-plan and a summary line:
"hf_llama_snip: steps N, loss first F -> last L (mean of 10 steps), FP4 share of the last re-plan S".
"""
import argparse
import os

import torch
import transformers

import snip
import snip.data

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--data", default="data/kjv", help="data folder of snip-data prepare (train.bin, tokenizer.model)")
p.add_argument("--steps", type=int, default=300, help="optimizer steps")
p.add_argument("--budget", type=float, default=0.75, help="FP4 share of the projections' FLOPs to reach")
p.add_argument("--batch", type=int, default=8, help="sequences per step")
p.add_argument("--seq", type=int, default=128, help="tokens per sequence")
p.add_argument("--run-dir", default=None, help="folder for plans/step-s.json and stats/step-s.json")
a = p.parse_args()
if not os.path.isfile(f"{a.data}/train.bin"):
    p.error(f"--data {a.data}: no train.bin there (scripts/run.sh prepares data/kjv)")

# ---- the user's code: model, optimizer, data, loop; snip adds three lines.
tokens = snip.data.read_tokens(f"{a.data}/train.bin")
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=snip.data.vocab_size(a.data), hidden_size=128, intermediate_size=344, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=a.seq, tie_word_embeddings=False))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
ctl = snip.Controller(model, opt, budget=a.budget, options=("nvfp4", "fp8"), max_steps=a.steps,
                      run_dir=a.run_dir)                                          # snip 1/3
gen = torch.Generator().manual_seed(0)
losses, planned = [], None
for step in range(a.steps):
    starts = torch.randint(0, len(tokens) - a.seq - 1, (a.batch,), generator=gen).tolist()
    ids = torch.stack([tokens[s:s + a.seq] for s in starts])
    m = ctl.begin_step(lambda: model(ids, labels=ids).loss)                      # snip 2/3
    if m["decided"]:
        print(f"step {step}: {m['phase']} phase, FP4 share {m['fp4_share']:.3f}", flush=True)
        planned = ctl.plan if m["phase"] == "plan" else planned
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    ctl.end_step()                                                                # snip 3/3
    losses.append(loss.item())

print(planned if planned else "no re-plan in so few steps")
n = min(10, len(losses))
print(f"hf_llama_snip: steps {a.steps}, loss first {sum(losses[:n]) / n:.4f} -> last {sum(losses[-n:]) / n:.4f} "
      f"(mean of {n} steps), FP4 share of the last re-plan {planned.fp4_share if planned else 0:.4f}")
