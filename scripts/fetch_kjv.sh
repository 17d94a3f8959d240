#!/bin/sh
# Writes the King James Bible (Debian 12 packages bible-kjv 4.38 and
# bible-kjv-text: the `bible` program and its compressed text) as 66 plain-text
# ASCII files, one per book, named 01-genesis.txt .. 66-revelation.txt so that
# a sorted listing is canonical order (~4.1 MB). Each chapter is one paragraph,
# chapters are separated by a blank line; verse references are dropped.
# Installs bible-kjv with apt-get (sudo if not root) when `bible` is missing.
# Idempotent: does nothing if OUT_DIR already holds 66 .txt files. For
# `snip data prepare --input OUT_DIR`.
#
# usage: scripts/fetch_kjv.sh [OUT_DIR]     (default: data/cache/kjv)
set -eu
out="${1:-data/cache/kjv}"

count_files() {
  if [ -d "$out" ]; then find "$out" -maxdepth 1 -type f -name '[0-6][0-9]-*.txt' | wc -l; else echo 0; fi
}
die() { echo "fetch_kjv.sh: error: $*" >&2; exit 1; }

if [ "$(count_files)" -eq 66 ]; then
  echo "KJV already in $out"
  exit 0
fi
if ! command -v bible >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "bible is not installed and neither root nor sudo is available (apt-get install bible-kjv)"
    sudo="sudo"
  fi
  command -v apt-get >/dev/null 2>&1 || die "bible is not installed and apt-get is missing (need Debian package bible-kjv)"
  $sudo apt-get install -y bible-kjv 1>&2 || die "apt-get install -y bible-kjv failed"
fi
mkdir -p "$out"
# `bible -f` prints one verse a line, "Ge1:1 In the beginning ...": a new book
# starts where the abbreviation changes, a new chapter where the chapter does.
bible -f Gen1:1-Rev22:21 | awk -v out="$out" -v names="genesis exodus leviticus numbers \
deuteronomy joshua judges ruth 1-samuel 2-samuel 1-kings 2-kings 1-chronicles 2-chronicles \
ezra nehemiah esther job psalms proverbs ecclesiastes song-of-solomon isaiah jeremiah \
lamentations ezekiel daniel hosea joel amos obadiah jonah micah nahum habakkuk zephaniah \
haggai zechariah malachi matthew mark luke john acts romans 1-corinthians 2-corinthians \
galatians ephesians philippians colossians 1-thessalonians 2-thessalonians 1-timothy \
2-timothy titus philemon hebrews james 1-peter 2-peter 1-john 2-john 3-john jude revelation" '
  BEGIN { nb = split(names, name, " ") }
  !match($1, /^[1-3]?[A-Za-z]+[0-9]+:[0-9]+$/) { print "bad line: " $0 > "/dev/stderr"; exit 1 }
  {
    ref = $1; book = ref; sub(/[0-9]+:[0-9]+$/, "", book)
    chap = substr(ref, length(book) + 1); sub(/:.*/, "", chap)
    text = substr($0, length(ref) + 2); gsub(/  +/, " ", text)
    if (book != prev) {
      if (file != "") { printf "\n" > file; close(file) }
      if (++b > nb) { print "more than " nb " books" > "/dev/stderr"; exit 1 }
      file = sprintf("%s/%02d-%s.txt", out, b, name[b]); printf "%s", text > file
    } else if (chap != pchap) printf "\n\n%s", text > file
    else printf " %s", text > file
    prev = book; pchap = chap
  }
  END { if (file != "") printf "\n" > file }' || die "could not convert the output of bible -f"
n="$(count_files)"
[ "$n" -eq 66 ] || die "expected 66 book files in $out, found $n"
echo "KJV written to $out (66 books)"
