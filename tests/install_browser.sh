#!/usr/bin/env bash
# Debian's chromium and chromedriver for tests/test_browser.py (nothing is downloaded by a
# test tool: the browser tests drive the system's chromium with selenium).
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "tests/install_browser.sh: no apt-get here; install chromium and chromedriver yourself," \
         "or the browser tests are skipped" >&2
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q chromium chromium-driver >/dev/null \
    || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q chromium chromium-driver >/dev/null; }
