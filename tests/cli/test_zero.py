#!/usr/bin/env python3
"""ZeRO stages 1 and 2 and per-rank optimizer shards (docs/distributed.md
"ZeRO"), through the real binary on 2 Gloo ranks on 127.0.0.1, 1 thread per
rank, the micro model, grad_clip 0.5 (so clipping acts):

  stages     train.zero_stage = 1 and 2 on 2 ranks == stage 0 on 2 ranks, bit
             for bit: loss, grad_norm, val_loss of every step, the final
             model.safetensors byte for byte; the AdamW m and v of every
             parameter in the shards appear byte for byte among optimizer.pt's
             records; the checkpoint holds optimizer_index.json naming every
             parameter once; per-rank memory in summary.json: stage 0 holds
             m + v = 2 x parameters on each rank, stages 1/2 split that over
             the ranks (sum = 2 x parameters, each rank less), stage 2 keeps
             gradients of its own parameters only (sum = parameters)
  resume     a stage-2 run resumed from step 4 on 2 ranks ends byte for byte
             where the uninterrupted run ends; a stage-0 checkpoint resumed
             under stage 1 and a stage-1 checkpoint resumed under stage 0 (2
             ranks) end where the stage-0 run ends, byte for byte
  reshard    2 -> 1: the stage-0 (optimizer.pt) and the stage-1 (shards)
             checkpoints of step 4 resumed on 1 rank continue to step 8 with
             identical losses and final weights (the re-sharded state equals
             the saved one by name: any difference would show); 1 -> 2: a
             1-rank checkpoint resumed on 2 ranks under stage 0 and under
             stage 1 continues identically; both record loader_base
  stats      policy snip on 2 ranks: stages 1 and 2 write the same
             stats/*.json, metrics and weights as stage 0 (the stats step reads m and v gathered
             from their owners)
  errors     a missing and a corrupt optimizer-rank1.safetensors: one
             `snip: error:` line naming the file, exit 2

usage: test_zero.py SNIP_BINARY PREPARED_DATA_DIR [CASE...]
"""
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, free_port, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
cases = sys.argv[3:] or ["stages", "resume", "reshard", "stats", "errors"]
tmp = tempfile.mkdtemp(prefix="snip-zero-")
T = Checks(snip)
check = T.check
procs = []



def rank_env(rank, world, port):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "GLOO_SOCKET_IFNAME": "lo"})
    return env


def run_ranks(world, args, timeout=120):
    """[(rc, out, err)] of a `world`-rank run of `snip ARGS` (world 1: no dist variables)."""
    if world == 1:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k not in ("RANK", "WORLD_SIZE")}
        ps = [subprocess.Popen([snip] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)]
    else:
        port = free_port()
        ps = [subprocess.Popen([snip] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=rank_env(r, world, port), start_new_session=True) for r in range(world)]
    procs.extend(ps)
    out = []
    for p in ps:
        try:
            o, e = p.communicate(timeout=timeout)
            out.append((p.returncode, o, e))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            o, e = p.communicate()
            out.append(("timeout", o, e))
    return out


def ok(name, res):
    check(all(r[0] == 0 for r in res), name, [r[2][-600:] for r in res])


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def numbers(run):
    return [(r["step"], r["loss"], r["grad_norm"], r.get("val_loss")) for r in metrics(run)]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def model(run, step):
    return read(os.path.join(run, "checkpoints", f"step-{step}", "model.safetensors"))


def optimizer_records(path):
    with zipfile.ZipFile(path) as z:
        return {hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist() if "/data/" in n}


def safetensors(path):
    """name -> raw bytes of every tensor of a safetensors file."""
    b = read(path)
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    body = b[8 + n:]
    return {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in head.items() if k != "__metadata__"}


def cut_at(run, step, dst):
    """A copy of `run` as it was after its checkpoint at `step` (later checkpoints and the summary removed)."""
    shutil.copytree(run, dst)
    ck = os.path.join(dst, "checkpoints")
    for n in os.listdir(ck):
        if n.startswith("step-") and int(n.split("-")[1].split(".")[0]) > step:
            shutil.rmtree(os.path.join(ck, n))
    if os.path.exists(os.path.join(dst, "summary.json")):
        os.remove(os.path.join(dst, "summary.json"))
    with open(os.path.join(ck, "last_good.json"), "w") as f:
        f.write(json.dumps({"step": step}) + "\n")
    return dst


cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, "max_steps = 8\neval_interval = 4\neval_batches = 3\ncheckpoint_interval = 4\n"
           "keep_checkpoints = 0\nsample_tokens = 0\nlog_interval = 1\ngrad_clip = 0.5")
train = ["train", "--config", cfg]
runs = {}


def stage_run(stage):
    if stage not in runs:
        runs[stage] = os.path.join(tmp, f"s{stage}")
        res = run_ranks(2, train + ["--run-dir", runs[stage], "--set", f"train.zero_stage={stage}"])
        ok(f"stage {stage} on 2 ranks", res)
    return runs[stage]


try:
    if "stages" in cases:
        s0 = stage_run(0)
        with open(os.path.join(s0, "summary.json")) as f:
            mem0 = json.load(f)["memory_per_rank"]
        P = mem0[0]["params_bytes"]
        check(len(mem0) == 2 and all(m["optimizer_bytes"] == 2 * P and m["grads_bytes"] == P for m in mem0),
              "stages: stage 0 holds gradients = parameters and m + v = 2 x parameters on each rank", str(mem0))
        for stage in (1, 2):
            run = stage_run(stage)
            check(numbers(run) == numbers(s0) and len(numbers(run)) == 8,
                  f"stages: stage {stage} metrics == stage 0 bit for bit", f"{numbers(run)[:2]} vs {numbers(s0)[:2]}")
            for step in (4, 8):
                check(model(run, step) == model(s0, step), f"stages: stage {stage} model at step {step} byte for byte")
                ck = os.path.join(run, "checkpoints", f"step-{step}")
                check(not os.path.exists(os.path.join(ck, "optimizer.pt")), f"stages: stage {stage} has no optimizer.pt")
                with open(os.path.join(ck, "optimizer_index.json")) as f:
                    idx = json.load(f)
                names = set(safetensors(os.path.join(ck, "model.safetensors")))
                check(set(idx["params"]) == names and idx["world_size"] == 2 and idx["zero_stage"] == stage,
                      f"stages: stage {stage} index names every parameter once", str(idx)[:300])
                shard = {}
                for r in (0, 1):
                    t = safetensors(os.path.join(ck, f"optimizer-rank{r}.safetensors"))
                    owned = {n for n, e in idx["params"].items() if e["owner"] == r}
                    check({k.rsplit(".", 1)[0] for k in t} == owned,
                          f"stages: stage {stage} rank {r}'s shard holds exactly its parameters")
                    shard.update(t)
                ref = optimizer_records(os.path.join(s0, "checkpoints", f"step-{step}", "optimizer.pt"))
                mv = [hashlib.sha256(b).hexdigest() for k, b in shard.items() if not k.endswith(".step")]
                check(len(mv) == 2 * len(names) and all(h in ref for h in mv),
                      f"stages: stage {stage} m and v at step {step} == optimizer.pt's, byte for byte")
                with open(os.path.join(ck, "manifest.json")) as f:
                    man = json.load(f)["files"]
                check({"optimizer_index.json", "optimizer-rank0.safetensors", "optimizer-rank1.safetensors"} <= set(man),
                      f"stages: stage {stage} manifest covers the index and both shards", str(sorted(man)))
            with open(os.path.join(run, "summary.json")) as f:
                mem = json.load(f)["memory_per_rank"]
            opt = [m["optimizer_bytes"] for m in mem]
            check(sum(opt) == 2 * P and max(opt) < 2 * P, f"stages: stage {stage} splits m + v over the ranks", str(mem))
            grads = [m["grads_bytes"] for m in mem]
            want = (sum(grads) == P and max(grads) < P) if stage == 2 else all(g == P for g in grads)
            check(want, f"stages: stage {stage} gradients per rank", str(mem))
            print(f"stage {stage} memory per rank: {mem}")
        print(f"stage 0 memory per rank: {mem0}")

    if "resume" in cases:
        s0, s1, s2 = stage_run(0), stage_run(1), stage_run(2)
        again = cut_at(s2, 4, os.path.join(tmp, "s2-resumed"))
        ok("resume: stage 2 from step 4 on 2 ranks",
           run_ranks(2, train + ["--run-dir", again, "--resume", "--set", "train.zero_stage=2"]))
        check(model(again, 8) == model(s2, 8) and numbers(again) == numbers(s2),
              "resume: stage 2 resumed ends byte for byte where the uninterrupted run ends")
        for src, stage in ((s0, 1), (s1, 0)):
            d = cut_at(src, 4, os.path.join(tmp, f"{os.path.basename(src)}-as-{stage}"))
            ok(f"resume: {os.path.basename(src)} under stage {stage}",
               run_ranks(2, train + ["--run-dir", d, "--resume", "--set", f"train.zero_stage={stage}"]))
            check(model(d, 8) == model(s0, 8) and numbers(d) == numbers(s0),
                  f"resume: {os.path.basename(src)} checkpoint resumed under stage {stage} ends where stage 0 ends")

    if "reshard" in cases:
        s0, s1 = stage_run(0), stage_run(1)
        ends = {}
        for src in (s0, s1):
            d = cut_at(src, 4, os.path.join(tmp, f"{os.path.basename(src)}-on-1"))
            res = run_ranks(1, train + ["--run-dir", d, "--resume"])
            ok(f"reshard: {os.path.basename(src)} 2 -> 1 rank", res)
            said = res[0][1] + res[0][2]
            # Another number of ranks is said; re-sharding only where there
            # were shards (the stage-1 run), not for the stage-0 run's state.
            check("was written by 2 ranks, this run has 1" in said, "reshard: 2 -> 1 says so", said[-400:])
            check(("re-sharded by parameter name" in said) == (src == s1),
                  f"reshard: {os.path.basename(src)}: re-sharding said only for sharded state", said[-400:])
            ends[src] = (model(d, 8), numbers(d))
            with open(os.path.join(d, "summary.json")) as f:
                tokens = json.load(f)["tokens"]
            # B = 2 sequences of T = 16 tokens per rank and step (micro_toml)
            check(tokens == 4 * (2 * 2 * 16) + 4 * (2 * 16),
                  "reshard: 2 -> 1 counts the tokens trained (4 steps on 2 ranks, then 4 on 1): 384", str(tokens))
            with open(os.path.join(d, "checkpoints", "step-8", "trainer_state.json")) as f:
                st = json.load(f)
            check(st.get("loader_base", {}).get("step") == 4 and "world_size" not in st,
                  "reshard: 2 -> 1 records loader_base at step 4", str(st.get("loader_base")))
        check(ends[s0] == ends[s1] and len(ends[s0][1]) == 8 and ends[s0][1][:4] == numbers(s0)[:4],
              "reshard: 2 -> 1 from optimizer.pt and from the shards continue identically")
        one = os.path.join(tmp, "one")
        ok("reshard: 1 rank to step 4", run_ranks(1, train + ["--run-dir", one, "--set", "train.max_steps=4"]))
        for stage in (0, 1):
            d = os.path.join(tmp, f"one-on-2-s{stage}")
            shutil.copytree(one, d)
            os.remove(os.path.join(d, "summary.json"))
            ok(f"reshard: 1 -> 2 ranks, stage {stage}",
               run_ranks(2, train + ["--run-dir", d, "--resume", "--set", f"train.zero_stage={stage}"]))
            ends[stage] = (model(d, 8), numbers(d))
            with open(os.path.join(d, "summary.json")) as f:
                tokens = json.load(f)["tokens"]
            check(tokens == 4 * (2 * 16) + 4 * (2 * 2 * 16),
                  f"reshard: 1 -> 2 (stage {stage}) counts the tokens trained (4 steps on 1 rank, then 4 on 2): 384",
                  str(tokens))
        check(ends[0] == ends[1] and len(ends[0][1]) == 8, "reshard: 1 -> 2 under stage 0 and stage 1 continue identically")

    if "stats" in cases:
        sets = ["--set", "precision.policy=snip", "--set", "precision.budget=0.5",
                "--set", "precision.warmup_steps=2", "--set", "precision.initial_interval=2",
                "--set", "precision.final_interval=2", "--set", "precision.final_high_precision_fraction=0"]
        out = {}
        for stage in (0, 1, 2):
            d = os.path.join(tmp, f"snip-s{stage}")
            ok(f"stats: policy snip, stage {stage}",
               run_ranks(2, train + ["--run-dir", d, "--set", f"train.zero_stage={stage}"] + sets))
            sd = os.path.join(d, "stats")
            out[stage] = ({n: read(os.path.join(sd, n)) for n in sorted(os.listdir(sd))} if os.path.isdir(sd) else {},
                          numbers(d), model(d, 8))
        for stage in (1, 2):
            check(len(out[0][0]) >= 2 and out[0] == out[stage],
                  f"stats: stage {stage} == stage 0 (stats files, metrics, weights)",
                  f"{list(out[0][0])} vs {list(out[stage][0])}")

    if "errors" in cases:
        s1 = stage_run(1)
        d = cut_at(s1, 4, os.path.join(tmp, "missing"))
        os.remove(os.path.join(d, "checkpoints", "step-4", "optimizer-rank1.safetensors"))
        T.expect_error("errors: missing shard", train + ["--run-dir", d, "--resume"],
                       "optimizer-rank1.safetensors", untouched=d)
        d = cut_at(s1, 4, os.path.join(tmp, "corrupt"))
        p = os.path.join(d, "checkpoints", "step-4", "optimizer-rank1.safetensors")
        b = bytearray(read(p))
        b[-1] ^= 0x55
        with open(p, "wb") as f:
            f.write(bytes(b))
        T.expect_error("errors: corrupt shard", train + ["--run-dir", d, "--resume"],
                       "optimizer-rank1.safetensors", untouched=d)
finally:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    shutil.rmtree(tmp, ignore_errors=True)
T.finish()
