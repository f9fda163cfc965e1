#!/usr/bin/env bash
# Install a headless Chromium for the test that renders `graphopt report`'s page. Best effort:
# where none can be installed, say why and carry on; that test skips with the reason. Source
# it from .ci/run.
_graphopt_chromium() {
    local found
    for found in chromium chromium-browser google-chrome google-chrome-stable; do
        if command -v "$found" >/dev/null 2>&1; then
            echo "chromium: using $(command -v "$found") for the report rendering test"
            return 0
        fi
    done
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "chromium: no chromium and no apt-get to install it; the rendering test will skip"
        return 0
    fi
    echo "chromium: installing Debian's chromium package"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
        >/dev/null 2>&1 || { echo "chromium: cannot install chromium; the rendering test will skip"; return 0; }
    if command -v chromium >/dev/null 2>&1; then
        echo "chromium: installed $(chromium --version 2>/dev/null || echo chromium)"
    else
        echo "chromium: the package installed no chromium binary; the rendering test will skip"
    fi
}
_graphopt_chromium
