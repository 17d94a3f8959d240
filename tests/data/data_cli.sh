#!/usr/bin/env bash
# `snip-data data prepare` through the real binary (what `snip data` execs):
#   1. --vocab-size out of range: exit 2, one line, no output folder;
#   2. a staging folder left by a dead process is removed by the next run;
#      a user corpus gets data/NAME by default, and a folder prepared from
#      other sources is refused unless --force;
#   3. SIGTERM and SIGINT during a prepare: the staging folder (and the output
#      folder this run created) are removed, one line on stderr, and the
#      process ends by the signal (status 128 + signal: 143, 130).
# Usage: data_cli.sh PATH/TO/snip-data
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # absolute: some checks run in another folder
work=$(mktemp -d /tmp/snip_data_cli.XXXXXX)
trap 'rm -rf "$work"' EXIT
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }

# ---- 1. --vocab-size range
printf 'a small corpus\n\nof two documents\n' > "$work/small.txt"
"$bin" data prepare --input "$work/small.txt" --vocab-size 1 --out "$work/v" 2> "$work/err"
rc=$?
want="snip: error: --vocab-size: expected an integer in [261, 4194304], got 1 (see --help)"
[ "$rc" = 2 ] && ok "--vocab-size 1: exit 2" || bad "--vocab-size 1: exit $rc, expected 2"
[ "$(cat "$work/err")" = "$want" ] && ok "--vocab-size 1: one line" || bad "--vocab-size 1: stderr was: $(cat "$work/err")"
[ ! -e "$work/v" ] && ok "--vocab-size 1: no output folder" || bad "--vocab-size 1: $work/v was created"

# ---- 2. stale staging folder of a dead process
( exit 0 ) &
dead=$!
wait "$dead"
mkdir -p "$work/s/.prepare.tmp.$dead"
echo partial > "$work/s/.prepare.tmp.$dead/train.bin"
if "$bin" data prepare --input "$work/small.txt" --vocab-size 300 --out "$work/s" > /dev/null 2>&1; then
  [ ! -e "$work/s/.prepare.tmp.$dead" ] && ok "stale staging folder removed" \
    || bad "stale staging folder $work/s/.prepare.tmp.$dead still there"
else
  bad "prepare with a stale staging folder failed"
fi

# ---- 2b. a user corpus gets its own folder; another corpus never silently
# replaces a prepared folder (--force does).
mkdir -p "$work/cwd" && cp "$work/small.txt" "$work/cwd/notes.txt"
printf 'other text\n\nin two documents\n' > "$work/cwd/other.txt"
( cd "$work/cwd" && "$bin" data prepare --input notes.txt --vocab-size 300 > out 2> err )
[ -f "$work/cwd/data/notes/meta.json" ] && ok "default --out data/notes" || bad "no data/notes/meta.json: $(cat "$work/cwd/err")"
grep -q "output folder: data/notes (from --input; --out to choose)" "$work/cwd/err" && ok "default --out said" \
  || bad "default --out not said: $(cat "$work/cwd/err")"
( cd "$work/cwd" && "$bin" data prepare --input other.txt --vocab-size 300 --out data/notes > out2 2> err2 ); rc=$?
want="snip: error: --out data/notes holds data prepared from notes.txt; this run reads other.txt: choose another --out, or pass --force to replace it"
[ "$rc" = 2 ] && [ "$(cat "$work/cwd/err2")" = "$want" ] && ok "other inputs refused" \
  || bad "other inputs: exit $rc, stderr: $(cat "$work/cwd/err2")"
( cd "$work/cwd" && "$bin" data prepare --input other.txt --vocab-size 300 --out data/notes --force > /dev/null 2>&1 ) \
  && grep -q '"other.txt"' "$work/cwd/data/notes/meta.json" && ok "--force replaces" || bad "--force did not replace"

# ---- 3. signals. A corpus whose BPE training takes seconds (random words), so
# the signal arrives while the prepare runs; job control on, so that a
# background job does not start with SIGINT ignored.
awk 'BEGIN { srand(7); for (d = 0; d < 1500; d++) { for (l = 0; l < 20; l++) { line = "";
       for (w = 0; w < 12; w++) { n = 2 + int(rand() * 6); s = "";
         for (k = 0; k < n; k++) s = s sprintf("%c", 97 + int(rand() * 26));
         line = line (w ? " " : "") s }
       print line } print "" } }' > "$work/big.txt"
set -m
for sig in TERM INT; do
  out="$work/out-$sig"
  "$bin" data prepare --input "$work/big.txt" --vocab-size 4000 --out "$out" 2> "$work/err-$sig" > /dev/null &
  pid=$!
  for _ in $(seq 1 300); do  # up to 30 s for the staging folder to appear
    [ -d "$out/.prepare.tmp.$pid" ] && break
    sleep 0.1
  done
  sleep 0.3
  if [ ! -d "$out/.prepare.tmp.$pid" ]; then
    bad "SIG$sig: no staging folder $out/.prepare.tmp.$pid while running"
    kill -KILL "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    continue
  fi
  kill -s "$sig" "$pid"
  wait "$pid"
  rc=$?
  want_rc=$((128 + $(kill -l "$sig")))
  [ "$rc" = "$want_rc" ] && ok "SIG$sig: status $rc" || bad "SIG$sig: status $rc, expected $want_rc"
  if [ -e "$out/meta.json" ]; then
    bad "SIG$sig: the prepare finished before the signal (make the corpus larger)"
  fi
  [ ! -e "$out" ] && ok "SIG$sig: staging and output folder removed" \
    || bad "SIG$sig: left behind: $(ls -A "$out" | tr '\n' ' ')"
  want_err="snip: interrupted by SIG$sig: removed $out/.prepare.tmp.$pid"
  last=$(tail -n 1 "$work/err-$sig")
  [ "$last" = "$want_err" ] && ok "SIG$sig: one line on stderr" || bad "SIG$sig: last stderr line was: $last"
done

if [ "$fails" -gt 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
