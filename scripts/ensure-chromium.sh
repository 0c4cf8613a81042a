#!/usr/bin/env bash
# Install Debian's chromium + chromium-driver for the admin end-to-end test when missing.
# Never fails the build: where no browser can be installed the test skips and says why.
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: not root or no apt-get; the browser test will be skipped" >&2
  exit 0
fi
echo "ensure-chromium: installing chromium and chromium-driver (Debian packages)..." >&2
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq >/dev/null && apt-get install -y -qq chromium chromium-driver >/dev/null; then
  echo "ensure-chromium: installed $(chromium --version 2>/dev/null)" >&2
else
  echo "ensure-chromium: installation failed; the browser test will be skipped" >&2
fi
exit 0
