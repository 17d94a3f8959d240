#!/usr/bin/env python3
"""Corrupt checkpoints, run folders, data folders and oversized models through
the real `snip` binary: every case must end with exit status 2 and one line
`snip: error: ...` naming the file and what is wrong, within seconds, and must
leave the run folder as it was; a stray folder under checkpoints/ is ignored
with a warning.

Each case here failed before the fix (a SIGSEGV, `snip: internal error`,
a silent acceptance or a run past its time limit).

usage: corrupt_inputs.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="snip-corrupt-")
T = Checks(snip)
run, record, expect_error = T.run, T.check, T.expect_error


def crc(path):
    with open(path, "rb") as f:
        b = f.read()
    return len(b), zlib.crc32(b)


def reseal(ckpt):
    """Recomputes the checksums of a checkpoint folder after an edit, as an
    attacker (or a careless hand) would: trainer_state.json's crc32 entries,
    then manifest.json."""
    sp = os.path.join(ckpt, "trainer_state.json")
    with open(sp) as f:
        try:
            st = json.load(f)
        except ValueError:
            st = None
    if isinstance(st, dict) and isinstance(st.get("crc32"), dict):
        for n in ("model.safetensors", "optimizer.pt", "config.json"):
            st["crc32"][n] = crc(os.path.join(ckpt, n))[1]
        with open(sp, "w") as f:
            json.dump(st, f, indent=2)
    mp = os.path.join(ckpt, "manifest.json")
    with open(mp) as f:
        man = json.load(f)
    for n in man["files"]:
        size, c = crc(os.path.join(ckpt, n))
        man["files"][n] = {"bytes": size, "crc32": c}
    with open(mp, "w") as f:
        json.dump(man, f, indent=2)


def edit_state(ckpt, fn):
    sp = os.path.join(ckpt, "trainer_state.json")
    with open(sp) as f:
        st = json.load(f)
    fn(st)
    with open(sp, "w") as f:
        json.dump(st, f, indent=2)


# ---- a pristine run: 4 steps, checkpoints at 2 and 4
cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, "max_steps = 4\ncheckpoint_interval = 2\neval_interval = 2\neval_batches = 1")
pristine = os.path.join(tmp, "pristine")
rc, out, err = run(["train", "--config", cfg, "--run-dir", pristine], timeout=300)
if rc != 0:
    print(f"the pristine run failed: rc={rc}\n{err}", file=sys.stderr)
    sys.exit(1)
n_case = 0


def fresh():
    """A copy of the pristine run and its step-4 checkpoint."""
    global n_case
    n_case += 1
    r = os.path.join(tmp, f"run{n_case}")
    shutil.copytree(pristine, r)
    return r, os.path.join(r, "checkpoints", "step-4")


def resume(r):
    return ["train", "--run-dir", r, "--resume", "--set", "train.max_steps=6"]


# trainer_state.json is covered by a checksum (manifest.json).
r, ck = fresh()
edit_state(ck, lambda st: st["loader"].update(epoch=18446744073709551615))
expect_error("trainer_state.json edited", resume(r), "trainer_state.json: checksum mismatch", untouched=r)

# The loader position must be where the step leaves it (epoch 2^64-1 was a SIGSEGV).
r, ck = fresh()
edit_state(ck, lambda st: st["loader"].update(epoch=18446744073709551615))
reseal(ck)
expect_error("loader epoch 2^64-1", resume(r), "loader position (epoch 18446744073709551615, cursor 8)",
             untouched=r)
r, ck = fresh()
edit_state(ck, lambda st: st["loader"].update(cursor=9))
reseal(ck)
expect_error("loader cursor off by one", resume(r), "is not where step 4 leaves it", untouched=r)

# Fields of trainer_state.json (a non-numeric elapsed_s was an internal error).
for name, fn, needle in [
    ("elapsed_s a string", lambda st: st.update(elapsed_s="x"), "elapsed_s: expected a finite number"),
    ("elapsed_s negative", lambda st: st.update(elapsed_s=-1.0), "elapsed_s: expected a finite number"),
    ("step 2^63", lambda st: st.update(step=2**63), "step: expected a step >= 0, got 9223372036854775808"),
    ("seed missing", lambda st: st.pop("seed"), "seed: missing"),
    ("val_loss a string", lambda st: st.update(val_loss="low"), "val_loss: expected a finite number >= 0, got \"low\""),
    ("val_loss negative", lambda st: st.update(val_loss=-1.0), "val_loss: expected a finite number >= 0, got -1.0"),
    ("data missing", lambda st: st.pop("data"), "missing the 'data' object"),
    ("seed changed", lambda st: st.update(seed=99), "has seed 99 but train.seed is 1234"),
    ("data vocab changed", lambda st: st["data"].update(vocab_size=513), "has data.vocab_size 513"),
    ("val_sha256 short", lambda st: st["data"].update(val_sha256="abc"), "data.val_sha256: expected 64"),
    ("val_sha256 upper case", lambda st: st["data"].update(val_sha256="A" * 64), "data.val_sha256: expected 64"),
    ("resumed_at not a list", lambda st: st.update(resumed_at=3), "resumed_at: expected an ascending list"),
    ("resumed_at past the step", lambda st: st.update(resumed_at=[5]), "resumed_at: expected an ascending list of steps in [0, 4]"),
    ("resumed_at descending", lambda st: st.update(resumed_at=[3, 2]), "resumed_at: expected an ascending list"),
    ("resumed_at negative", lambda st: st.update(resumed_at=[-1]), "resumed_at: expected an ascending list"),
]:
    r, ck = fresh()
    edit_state(ck, fn)
    reseal(ck)
    expect_error(name, resume(r), needle, untouched=r)

# metrics.jsonl read back at resume ({"step":"x"} was an internal error).
r, ck = fresh()
with open(os.path.join(r, "metrics.jsonl"), "a") as f:
    f.write('{"step":"x"}\n{"step":5,"loss":1}\n')
expect_error("metrics.jsonl step a string", resume(r), "metrics.jsonl: line 5: step: expected an integer",
             untouched=r)
r, ck = fresh()
lines = open(os.path.join(r, "metrics.jsonl")).read().splitlines()
lines[1] = json.dumps(dict(json.loads(lines[1]), loss="nan"))
open(os.path.join(r, "metrics.jsonl"), "w").write("\n".join(lines) + "\n")
expect_error("metrics.jsonl loss a string", resume(r), "metrics.jsonl: line 2: loss: expected a number",
             untouched=r)

# A checkpoint config.json of just "{" (checksums recomputed) was an internal error.
r, ck = fresh()
open(os.path.join(ck, "config.json"), "w").write("{")
reseal(ck)
expect_error("config.json '{' at resume", resume(r), "config.json: expected valid JSON", untouched=r)
expect_error("config.json '{' at eval", ["eval", "--run-dir", r], "config.json: expected valid JSON", untouched=r)
# Found by fuzz_checkpoint: a number past a double in config.json was an internal error.
r, ck = fresh()
open(os.path.join(ck, "config.json"), "w").write('{"hidden_size": 31e309}')
reseal(ck)
expect_error("config.json 31e309 at eval", ["eval", "--run-dir", r], "expected a number a double can hold",
             untouched=r)

# A model too large for any machine in a checkpoint config (hidden_size 2^40
# was an internal error; num_hidden_layers 2^40 ran for a long time).
for field in ("hidden_size", "num_hidden_layers", "vocab_size"):
    r, ck = fresh()
    c = json.load(open(os.path.join(ck, "config.json")))
    c[field] = 2**40
    json.dump(c, open(os.path.join(ck, "config.json"), "w"))
    reseal(ck)
    expect_error(f"checkpoint {field} 2^40 at eval", ["eval", "--run-dir", r],
                 f"{field}: expected at most 2^31 - 1", untouched=r)
# ... and one within the caps but far past this machine's memory.
r, ck = fresh()
c = json.load(open(os.path.join(ck, "config.json")))
c["num_hidden_layers"] = 2**20
c["intermediate_size"] = 2**16
json.dump(c, open(os.path.join(ck, "config.json"), "w"))
reseal(ck)
expect_error("checkpoint model past memory at eval", ["eval", "--run-dir", r], "GiB of memory are available",
             untouched=r)
# The same shape in a Hugging Face folder: refused before its weights are read.
hf_big = os.path.join(tmp, "hf-big")
rc, out, err = run(["export", "--run-dir", pristine, "--out", hf_big])
record(rc == 0, "export for the HF memory check", err[-300:])
c = json.load(open(os.path.join(hf_big, "config.json")))
c["num_hidden_layers"] = 2**20
c["intermediate_size"] = 2**16
json.dump(c, open(os.path.join(hf_big, "config.json"), "w"))
expect_error("Hugging Face model past memory at eval", ["eval", "--checkpoint", hf_big, "--data", data],
             "snip eval --checkpoint " + hf_big + ": the model and batch need at least", untouched=hf_big)

# optimizer.pt: NaN moments in a well-formed archive are refused; random byte
# flips (checksums recomputed) either are refused or resume to finite losses.
def rewrite_zip(path, fn):
    with zipfile.ZipFile(path) as z:
        entries = [(i, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for info, b in entries:
            z.writestr(info.filename, fn(info.filename, b))


r, ck = fresh()
nan4 = bytes.fromhex("0000c07f")  # float32 NaN, little-endian
rewrite_zip(os.path.join(ck, "optimizer.pt"),
            lambda n, b: (nan4 * (len(b) // 4)) if "/data/" in n and len(b) >= 64 else b)
reseal(ck)
expect_error("optimizer.pt NaN moments", resume(r), "holds non-finite values (corrupt)", untouched=r)
r, ck = fresh()
rewrite_zip(os.path.join(ck, "optimizer.pt"),
            lambda n, b: (bytes.fromhex("000080bf") * (len(b) // 4)) if "/data/" in n and len(b) >= 64 else b)
reseal(ck)
expect_error("optimizer.pt negative exp_avg_sq", resume(r), "exp_avg_sq holds negative values (corrupt)", untouched=r)

rng = random.Random(17)
flip_ok = 0
size = os.path.getsize(os.path.join(pristine, "checkpoints", "step-4", "optimizer.pt"))
for k in range(16):
    r, ck = fresh()
    p = os.path.join(ck, "optimizer.pt")
    b = bytearray(open(p, "rb").read())
    for _ in range(4):
        b[rng.randrange(size)] ^= 1 << rng.randrange(8)
    open(p, "wb").write(bytes(b))
    reseal(ck)
    rc, out, err = run(resume(r))
    lines = err.splitlines()
    if rc == 2:
        # One error line, last; log and progress lines (stderr) may come
        # before it when the guard stopped the resumed run after its steps.
        errors = [l for l in lines if l.startswith("snip: error: ")]
        ok = len(errors) == 1 and lines[-1] == errors[0] and \
            all(l == errors[0] or re.match(r"^(\[\d\d:\d\d:\d\d\] |step +\d+/\d+ \|)", l) for l in lines)
    elif rc == 0:
        recs = [json.loads(l) for l in open(os.path.join(r, "metrics.jsonl"))]
        ok = all(math.isfinite(x["loss"]) and math.isfinite(x.get("val_loss", 0)) for x in recs)
    else:
        ok = False
    flip_ok += ok
    record(ok, f"optimizer.pt flip {k}", f"rc={rc} stderr={err[-400:]!r}")

# Found by review: a file where checkpoints/ should be was an internal error
# after metrics.jsonl and config.toml had been rewritten.
r, ck = fresh()
shutil.rmtree(os.path.join(r, "checkpoints"))
open(os.path.join(r, "checkpoints"), "w").write("x")
expect_error("checkpoints is a file", resume(r), "checkpoints is not a folder", untouched=r)

# A NaN weight (checksums recomputed) printed a NaN loss (eval), was exported,
# or ended a resume with "training diverged" naming no file.
r, ck = fresh()
p = os.path.join(ck, "model.safetensors")
b = bytearray(open(p, "rb").read())
b[-4:] = bytes.fromhex("0000c07f")  # the last float32 of the last tensor: NaN
open(p, "wb").write(bytes(b))
reseal(ck)
for name, args in [("resume", resume(r)), ("eval", ["eval", "--run-dir", r]),
                   ("export", ["export", "--run-dir", r, "--out", os.path.join(tmp, "nan-export")])]:
    expect_error(f"NaN weight at {name}", args, "holds a non-finite value", untouched=r,
                 absent=os.path.join(tmp, "nan-export"))

# metrics.jsonl must hold steps 1 .. N once each (a repeated or missing
# record, or a garbage line, was accepted and kept).
for name, edit, needle in [
    ("repeated", lambda ls: ls[:2] + ls[1:], "line 3: step 2 where step 3 was expected (a record repeated"),
    ("missing", lambda ls: ls[:1] + ls[2:], "line 2: step 3 where step 2 was expected (a record missing"),
    ("garbage line", lambda ls: ls[:1] + ["{garbage"] + ls[1:], "line 2: not a JSON record"),
]:
    r, ck = fresh()
    mp = os.path.join(r, "metrics.jsonl")
    lines = open(mp).read().splitlines()
    open(mp, "w").write("\n".join(edit(lines)) + "\n")
    expect_error(f"metrics.jsonl {name}", resume(r), needle, untouched=r)

# manifest.json: another version, or an entry that is not one of the four files.
for name, fn, needle in [
    ("manifest version 2", lambda m: m.update(version=2), "expected \"format\": \"snip-checkpoint\", \"version\": 1"),
    ("manifest extra entry", lambda m: m["files"].update({"../../config.toml": {"bytes": 1, "crc32": 1}}),
     "files: unexpected entry \"../../config.toml\""),
]:
    r, ck = fresh()
    mp = os.path.join(ck, "manifest.json")
    m = json.load(open(mp))
    fn(m)
    json.dump(m, open(mp, "w"))
    expect_error(name, ["eval", "--run-dir", r], needle, untouched=r)

# A stray folder under checkpoints/ is ignored with a warning (a step number
# past 2^63 - 1 was a std::stoll internal error).
r, ck = fresh()
stray = os.path.join(r, "checkpoints", "step-99999999999999999999")
shutil.copytree(ck, stray)
os.makedirs(os.path.join(r, "checkpoints", "notes"))
rc, out, err = run(resume(r))
record(rc == 0 and "ignoring " + stray + ": its step number is out of range" in out + err
       and "checkpoints/notes: it is not a checkpoint folder" in out + err, "stray checkpoint folders",
       f"rc={rc} out={out[-600:]!r} err={err[-600:]!r}")
rc, out, err = run(["eval", "--run-dir", r, "--batches", "1"])
record(rc == 0, "stray folders at eval", f"rc={rc} err={err[-400:]!r}")

# Sizes checked against memory before anything is allocated (a 17 GB logits
# allocation was an internal error; 4096 layers ran a long time).
for name, sets in [
    ("batch_size 2^20 x seq 16", ["train.batch_size=1048576"]),
    ("4096 layers", ["model.num_hidden_layers=4096", "model.hidden_size=1024", "model.intermediate_size=4096",
                     "model.num_attention_heads=8", "model.num_key_value_heads=8"]),
    ("vocab 2^22", ["model.vocab_size=4194304", "model.hidden_size=1024", "model.num_attention_heads=8",
                    "model.num_key_value_heads=8"]),
]:
    rd = os.path.join(tmp, "big-" + name.replace(" ", "_"))
    args = ["train", "--config", cfg, "--run-dir", rd]
    for s in sets:
        args += ["--set", s]
    expect_error(name, args, "GiB of memory are available", absent=rd)

# Data folders are checked as a whole: meta.json, tokenizer.model and the
# shards must agree (deleting meta.json and tokenizer.model was accepted).
def data_case(name, fn, needle):
    d = os.path.join(tmp, "data-" + name.replace(" ", "_"))
    shutil.copytree(data, d)
    fn(d)
    c = os.path.join(d, "m.toml")
    micro_toml(c, d, "max_steps = 2")
    rd = os.path.join(tmp, "run-" + name.replace(" ", "_"))
    expect_error(name, ["train", "--config", c, "--run-dir", rd], needle, absent=rd)


def edit_meta(d, fn):
    p = os.path.join(d, "meta.json")
    m = json.load(open(p))
    fn(m)
    json.dump(m, open(p, "w"))


def poke(path, offset, value):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes([value]))


data_case("no meta.json", lambda d: os.remove(os.path.join(d, "meta.json")), "meta.json: missing")
data_case("no tokenizer", lambda d: os.remove(os.path.join(d, "tokenizer.model")), "tokenizer.model: missing")
data_case("tokenizer changed", lambda d: open(os.path.join(d, "tokenizer.model"), "ab").write(b"\0"),
          "tokenizer.model: SHA-256")
data_case("meta vocab", lambda d: edit_meta(d, lambda m: m.update(vocab_size=1000)),
          "train.bin: vocabulary 512 but")
data_case("meta dtype", lambda d: edit_meta(d, lambda m: m["shards"]["val"].update(dtype="uint32")),
          "val.bin: token dtype uint16 but")
data_case("meta token count", lambda d: edit_meta(d, lambda m: m["tokens"].update(train=5)),
          "tokens but")
data_case("meta path escapes", lambda d: edit_meta(d, lambda m: m["tokenizer"].update(path="../x")),
          "tokenizer.path: expected a file name inside the folder")
data_case("meta not JSON", lambda d: open(os.path.join(d, "meta.json"), "w").write("{"), "meta.json: expected valid JSON")
data_case("meta a list", lambda d: open(os.path.join(d, "meta.json"), "w").write("[]"), "meta.json: not a JSON object")
data_case("meta number past a double", lambda d: open(os.path.join(d, "meta.json"), "w").write('{"vocab_size": 1e309}'),
          "expected a number a double can hold")
data_case("reserved header byte", lambda d: poke(os.path.join(d, "train.bin"), 40, 7),
          "reserved header byte 40 is 7, expected 0")

shutil.rmtree(tmp, ignore_errors=True)
T.finish()
