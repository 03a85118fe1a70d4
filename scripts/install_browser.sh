#!/usr/bin/env bash
# Installs the headless browser for the browser test (tests/test_browser.py): Debian's `chromium` package, driven
# by Playwright for Python (no Playwright browser download). Does nothing when /usr/bin/chromium exists.
# Needs root (or sudo) and apt; `make test` runs it before the tests.
set -euo pipefail

CHROMIUM=/usr/bin/chromium
[ -x "$CHROMIUM" ] && exit 0

if [ "$(id -u)" = 0 ]; then
  sudo=()
elif command -v sudo >/dev/null; then
  sudo=(sudo)
else
  echo "error: $CHROMIUM is missing; install it as root: apt-get install -y --no-install-recommends chromium" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "error: $CHROMIUM is missing and there is no apt-get; install Debian's or Ubuntu's chromium package" >&2
  exit 1
fi
echo "Installing chromium (apt) for the browser test..."
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
[ -x "$CHROMIUM" ] || { echo "error: apt installed chromium, but $CHROMIUM is not there" >&2; exit 1; }
