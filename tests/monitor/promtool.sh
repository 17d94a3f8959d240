#!/usr/bin/env bash
# promtool check rules + test rules on the shipped alert rules, and check
# config on the example scrape configuration (deploy/prometheus/). promtool
# comes with Debian's prometheus package (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/../../deploy/prometheus"
command -v promtool >/dev/null || { echo "promtool not found: run scripts/setup.sh (apt package prometheus)" >&2; exit 1; }
promtool check rules snip-rules.yml
promtool test rules snip-rules-test.yml
promtool check config prometheus.yml
