#!/usr/bin/env bash
# Installs the Debian packages the tests need and pip cannot give: `chromium` for the browser test
# (tests/test_browser.py, driven by Playwright for Python, no Playwright browser download) and `nftables` for the
# multi-host cluster's firewall faults (tests/test_multihost.py). Installs only what is missing; nothing to do once
# both are there. Needs root (or sudo) and apt; `make test` runs it before the tests.
set -euo pipefail

declare -A WANTED=([chromium]=/usr/bin/chromium [nftables]=/usr/sbin/nft)
missing=()
for package in "${!WANTED[@]}"; do
  [ -x "${WANTED[$package]}" ] || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ]; then
  sudo=()
elif command -v sudo >/dev/null; then
  sudo=(sudo)
else
  echo "error: ${missing[*]} missing; install as root: apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "error: ${missing[*]} missing and there is no apt-get; install Debian's or Ubuntu's packages of that name" >&2
  exit 1
fi
echo "Installing ${missing[*]} (apt) for the tests..."
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for package in "${missing[@]}"; do
  [ -x "${WANTED[$package]}" ] || { echo "error: apt installed $package, but ${WANTED[$package]} is not there" >&2; exit 1; }
done
