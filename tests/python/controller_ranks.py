"""One rank of test_controller.py's 2-rank run (torchrun, Gloo on 127.0.0.1):
a tiny Hugging Face Llama under DistributedDataParallel, each rank on its own
micro-batches of the project's corpus, snip.Controller on the module inside.
Writes ARGV[1]/rank<r>.json: every decision, the last statistics, a CRC of
the weights. With ARGV[2] = "fail": rank 1's loss_fn raises in the first
stats step; each rank records the snip.Error it got (none may hang)."""
import datetime
import json
import os
import sys
import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers

import snip
import snip.data


def main(out, mode):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)  # the same initial weights on both ranks
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ctl = snip.Controller(model, opt, budget=0.75, options=("nvfp4", "fp8"), max_steps=20,
                          run_dir=os.path.join(out, "run"))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    toks = snip.data.read_tokens(os.path.join(os.environ["SNIP_DATA"], "train.bin"))[: 2 * 10 * 2 * 33]
    batches = toks.view(10, 2, 2, 33)[:, rank]  # this rank's micro-batches

    def loss_of(m, ids):
        logits = m(ids[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, 512).float(), ids[:, 1:].reshape(-1))

    def stats_loss(ids):
        if mode == "fail" and rank == 1:
            raise ValueError("rank 1's loss_fn failed")
        return loss_of(model, ids)

    if mode == "fail":
        ctl.begin_step(lambda: loss_of(model, batches[0]))  # step 0: warmup, no stats
        ctl.end_step()
        try:
            ctl.begin_step(lambda: stats_loss(batches[1]))  # step 1: the first stats step
            error = None
        except Exception as e:  # noqa: BLE001 - recorded for the test
            error = f"{type(e).__name__}: {e}"
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"error": error}, f)
        dist.barrier()  # both recorded before either leaves
        dist.destroy_process_group()
        return
    plans = []
    for step in range(20):
        ids = batches[step % 10]
        if ctl.begin_step(lambda: loss_of(model, ids))["decided"]:
            plans.append({"step": step, "assignments": ctl.plan.assignments})
        loss_of(ddp, ids).backward()
        opt.step()
        opt.zero_grad()
        ctl.end_step()
    crc = 0
    for t in model.state_dict().values():
        crc = zlib.crc32(t.contiguous().numpy().tobytes(), crc)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"plans": plans, "stats": ctl.stats(), "weights_crc": crc, "schedule": ctl.schedule}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "train")
