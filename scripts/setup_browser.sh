#!/usr/bin/env bash
# Debian's Chromium, for the test that renders `ardea report`'s trajectories.html in a real
# headless browser (its DOM and a screenshot). Training never needs it. Installed with
# apt-get when missing (as root, or with sudo); elsewhere it says what to install.
# Rerunnable: nothing happens when chromium is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "[setup-browser] no chromium and no apt-get: install Chromium for the report's browser test" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "[setup-browser] installing Debian's chromium (about 100 MB)"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
chromium --version
