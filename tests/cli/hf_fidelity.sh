#!/usr/bin/env bash
# Two checks through the real `snip` binary:
#   1. a spec-valid safetensors dtype (F8_E8M0) is read, decoded and
#      quantized; F6 (bit order undefined) is refused in one line;
#   2. `snip train --init-from DIR` honours the fields of DIR/config.json
#      (rope_theta 500000 reaches the model, config.toml and the
#      checkpoints), refuses in one line a field the run sets otherwise, and
#      never drops a tensor of the file (an untied head, a stray tensor)
#      unless it is provably redundant (a head equal to the embeddings).
# Refusals exit 2 with one line `snip: error: ...` and leave no run folder.
#
# usage: hf_fidelity.sh SNIP_BINARY PREPARED_DATA_DIR
set -u
snip="$1"; data="$2"
export OMP_WAIT_POLICY=PASSIVE
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/micro_toml.sh"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*" >&2; }

# expect NAME NEEDLE -- command...: exit 2, one stderr line with NEEDLE.
expect() {
  local name="$1" needle="$2"; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$needle" "$tmp/err" && grep -q "^snip: error: " "$tmp/err"; then ok
  else bad "$name: rc=$rc lines=$lines (want 2, 1, '$needle'):"; cat "$tmp/err" >&2; fi
}
absent() { if [ -e "$1" ]; then bad "$1 was left behind"; else ok; fi; }
# has NAME FILE TEXT: FILE contains TEXT (fixed string)
has() { if grep -qF -- "$3" "$2"; then ok; else bad "$1: '$3' not in $2:"; cat "$2" >&2; fi; }

# Safetensors and config.json edits, with Python's standard library only.
cat >"$tmp/st.py" <<'PY'
import json, struct, sys

def read(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop('__metadata__', None)
    return {k: [v['dtype'], v['shape'], b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]]]
            for k, v in h.items()}

def write(path, t):
    h, data, off = {}, b'', 0
    for k, (d, s, b) in t.items():
        h[k] = {'dtype': d, 'shape': s, 'data_offsets': [off, off + len(b)]}
        off += len(b)
        data += b
    hb = json.dumps(h).encode()
    hb += b' ' * ((8 - len(hb) % 8) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(hb)) + hb + data)

def f32(b):
    return list(struct.unpack('<%df' % (len(b) // 4), b))

cmd = sys.argv[1]
if cmd == 'mx':          # a spec-valid file: w F32 [1,4], w_scale F8_E8M0 [1] = 0x7F
    write(sys.argv[2], {'w': ['F32', [1, 4], struct.pack('<4f', 1.0, 0.5, -3.0, 2.0 ** -10)],
                        'w_scale': ['F8_E8M0', [1], b'\x7f']})
elif cmd == 'f6':
    write(sys.argv[2], {'w': ['F32', [1, 4], struct.pack('<4f', 1, 2, 3, 4)],
                        'w6': ['F6_E2M3', [4], b'\x01\x02\x03']})
elif cmd == 'show':      # dtype and FP32 values of one tensor
    d, s, b = read(sys.argv[2])[sys.argv[3]]
    print(d, f32(b) if d == 'F32' else b.hex())
elif cmd == 'config':    # config.json: set KEY to the JSON VALUE
    c = json.load(open(sys.argv[2]))
    c[sys.argv[3]] = json.loads(sys.argv[4])
    json.dump(c, open(sys.argv[2], 'w'))
elif cmd == 'head':      # add lm_head.weight: 'same' as the embeddings, or 'other' (one sign flipped)
    p = sys.argv[2] + '/model.safetensors'
    t = read(p)
    d, s, b = t['model.embed_tokens.weight']
    if sys.argv[3] == 'other':
        b = bytearray(b); b[3] ^= 0x80; b = bytes(b)
    t['lm_head.weight'] = [d, s, b]
    write(p, t)
elif cmd == 'extra':     # a tensor no parameter uses
    p = sys.argv[2] + '/model.safetensors'
    t = read(p)
    t['model.layers.0.mlp.gate_proj.weight_scale_inv'] = ['F32', [1], struct.pack('<f', 1.0)]
    write(p, t)
elif cmd == 'retype':    # model.norm.weight as DTYPE: I32 (refused) or F8_E4M3 (all 1.0: code 0x38)
    p = sys.argv[2] + '/model.safetensors'
    t = read(p)
    d, s, b = t['model.norm.weight']
    n = len(b) // 4
    t['model.norm.weight'] = [sys.argv[3], s, b'\x38' * n if sys.argv[3] == 'F8_E4M3' else b'\x01\x00\x00\x00' * n]
    write(p, t)
PY
st() { python3 "$tmp/st.py" "$@"; }

# ---- check 1: snip quantize reads every dtype of the format
st mx "$tmp/mx.safetensors"
"$snip" quantize --scheme bf16 --input "$tmp/mx.safetensors" --output "$tmp/mx_out.safetensors" >"$tmp/q" 2>"$tmp/qerr" \
  && ok || { bad "quantize of an F8_E8M0 scale:"; cat "$tmp/qerr" >&2; }
if [ -f "$tmp/mx_out.safetensors" ]; then
  st show "$tmp/mx_out.safetensors" w_scale >"$tmp/ws"
  has "w_scale decoded to 1.0 and written as F32" "$tmp/ws" "F32 [1.0]"
  st show "$tmp/mx_out.safetensors" w >"$tmp/w"
  has "w kept by the bf16 cast" "$tmp/w" "F32 [1.0, 0.5, -3.0, 0.0009765625]"
else bad "no quantize output"; fi
st f6 "$tmp/f6.safetensors"
expect "F6 refused" "tensor 'w6': F6_E2M3 is not decoded" -- \
  "$snip" quantize --scheme bf16 --input "$tmp/f6.safetensors" --output "$tmp/f6_out.safetensors"
absent "$tmp/f6_out.safetensors"

# ---- check 2: --init-from
# A tiny tied model exported as a Hugging Face folder; t.toml sets its shape
# but neither rope_theta nor tie_word_embeddings.
micro_toml "$tmp/t.toml" "$data" "max_steps = 2"
"$snip" train --config "$tmp/t.toml" --run-dir "$tmp/base" >/dev/null 2>&1 || bad "base run"
"$snip" export --run-dir "$tmp/base" --out "$tmp/hf" >/dev/null 2>&1 || bad "export"
fresh() { rm -rf "$tmp/$1"; cp -r "$tmp/hf" "$tmp/$1"; }  # fresh NAME: a copy of the exported folder

# rope_theta 500000 in the file: the run takes it (before: trained with 10000, silently).
fresh theta; st config "$tmp/theta/config.json" rope_theta 500000.0
"$snip" train --config "$tmp/t.toml" --run-dir "$tmp/r_theta" --init-from "$tmp/theta" >"$tmp/o1" 2>&1 \
  || { bad "init-from with rope_theta 500000:"; cat "$tmp/o1" >&2; }
has "the run says it took rope_theta" "$tmp/o1" "--init-from: model.rope_theta = 500000.0 from $tmp/theta/config.json"
has "config.toml holds it" "$tmp/r_theta/config.toml" "rope_theta = 5"
ck=$(ls -d "$tmp"/r_theta/checkpoints/step-* 2>/dev/null | head -1)
has "the checkpoint's config.json holds it" "${ck:-$tmp/none}/config.json" '"rope_theta": 500000.0'
# The run sets rope_theta otherwise: refused, naming the field and both values.
expect "rope_theta set otherwise" \
  "--init-from $tmp/theta/config.json: rope_theta 500000.0 differs from the run's model.rope_theta 10000.0; set model.rope_theta = 500000.0" -- \
  "$snip" train --config "$tmp/t.toml" --set model.rope_theta=10000 --run-dir "$tmp/r1" --init-from "$tmp/theta"
absent "$tmp/r1"
# A shape field set otherwise: refused the same way.
expect "hidden_size set otherwise" "hidden_size 32 differs from the run's model.hidden_size 64" -- \
  "$snip" train --config "$tmp/t.toml" --set model.hidden_size=64 --run-dir "$tmp/r2" --init-from "$tmp/hf"
absent "$tmp/r2"

# A value taken from the file that the rest of the run cannot use: the
# message says where it came from.
grep -v '^max_position_embeddings' "$tmp/t.toml" >"$tmp/t2.toml"
fresh short; st config "$tmp/short/config.json" max_position_embeddings 8
expect "max_position_embeddings taken, too short for train.seq_len" \
  "train.seq_len (16) exceeds model.max_position_embeddings (8) (with [model] options taken from $tmp/short/config.json by --init-from)" -- \
  "$snip" train --config "$tmp/t2.toml" --run-dir "$tmp/r8" --init-from "$tmp/short"
absent "$tmp/r8"
fresh vocab; st config "$tmp/vocab/config.json" vocab_size 100
expect "a vocabulary smaller than the tokenizer's" "vocab_size 100 is smaller than the tokenizer's vocabulary 512" -- \
  "$snip" train --config "$tmp/t.toml" --run-dir "$tmp/r9" --init-from "$tmp/vocab"
absent "$tmp/r9"

# tie_word_embeddings false with its own head, into a run that ties: the
# head would be dropped (before: silently).
fresh untied; st config "$tmp/untied/config.json" tie_word_embeddings false; st head "$tmp/untied" other
expect "untied head into a tied run" "its head would be dropped; set model.tie_word_embeddings = false" -- \
  "$snip" train --config "$tmp/t.toml" --set model.tie_word_embeddings=true --run-dir "$tmp/r3" --init-from "$tmp/untied"
absent "$tmp/r3"
# ... taken as an untied run when the run leaves the option unset.
"$snip" train --config "$tmp/t.toml" --run-dir "$tmp/r_untied" --init-from "$tmp/untied" >"$tmp/o2" 2>&1 \
  || { bad "untied file, run leaves tie unset:"; cat "$tmp/o2" >&2; }
has "the run unties" "$tmp/r_untied/config.toml" "tie_word_embeddings = false"
# A head equal to the embeddings bit for bit is redundant: the tied run drops nothing.
fresh same; st config "$tmp/same/config.json" tie_word_embeddings false; st head "$tmp/same" same
"$snip" train --config "$tmp/t.toml" --set model.tie_word_embeddings=true --run-dir "$tmp/r_same" --init-from "$tmp/same" \
  >"$tmp/o3" 2>&1 || { bad "redundant head:"; cat "$tmp/o3" >&2; }
has "the redundant head is named" "$tmp/o3" "lm_head.weight equals model.embed_tokens.weight bit for bit"

# A tensor nothing uses (an FP8 checkpoint's scale): refused.
fresh extra; st extra "$tmp/extra"
expect "unused tensor" "unexpected tensor 'model.layers.0.mlp.gate_proj.weight_scale_inv'" -- \
  "$snip" train --config "$tmp/t.toml" --run-dir "$tmp/r4" --init-from "$tmp/extra"
absent "$tmp/r4"
# Weights per dtype: an integer tensor is refused by name; F8_E4M3 loads.
fresh int; st retype "$tmp/int" I32
expect "integer weight" "tensor 'model.norm.weight': I32 is not floating point" -- \
  "$snip" train --config "$tmp/t.toml" --run-dir "$tmp/r5" --init-from "$tmp/int"
absent "$tmp/r5"
fresh fp8; st retype "$tmp/fp8" F8_E4M3
"$snip" train --config "$tmp/t.toml" --run-dir "$tmp/r_fp8" --init-from "$tmp/fp8" >"$tmp/o4" 2>&1 \
  && ok || { bad "F8_E4M3 weight:"; cat "$tmp/o4" >&2; }
# Fields snip does not implement: refused by name.
fresh scaled; st config "$tmp/scaled/config.json" rope_scaling '{"rope_type": "llama3", "factor": 8.0}'
expect "rope scaling" "field 'rope_scaling': rope_type \"llama3\" is not supported" -- \
  "$snip" train --config "$tmp/t.toml" --run-dir "$tmp/r6" --init-from "$tmp/scaled"
absent "$tmp/r6"
fresh quant; st config "$tmp/quant/config.json" quantization_config '{"quant_method": "fp8"}'
expect "quantized weights" "field 'quantization_config': the weights are stored quantized" -- \
  "$snip" train --config "$tmp/t.toml" --run-dir "$tmp/r7" --init-from "$tmp/quant"
absent "$tmp/r7"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
