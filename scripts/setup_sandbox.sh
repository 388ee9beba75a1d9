#!/bin/sh
# Installs bubblewrap, which isolates every agent command of the local agentic runtime
# (docs/hard51.md, "Sandbox"). Never fails: without bwrap the local runtime refuses untrusted
# tasks and the sandbox tests skip, each saying why.
command -v bwrap >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing bubblewrap (apt-get install bubblewrap)"
    if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null 2>&1; then
        exit 0
    fi
    echo "warning: apt-get could not install bubblewrap" >&2
fi
echo "warning: bubblewrap (bwrap) is not installed; install it (Debian/Ubuntu: apt-get install bubblewrap," \
     "as root) or the local agentic runtime refuses tasks unless task.trusted=true" >&2
exit 0
