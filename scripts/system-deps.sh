#!/bin/sh
# Installs the operating-system packages behind synthloop's sandbox boundary: bubblewrap (the namespaces) and
# libseccomp2 (the system-call filter). Without them everything runs except untrusted code (LLM-written checks,
# plugins, third-party servers), which is refused with a message saying what to install. Never fails the caller.
need=""
command -v bwrap >/dev/null 2>&1 || [ -x /usr/bin/bwrap ] || need="bubblewrap"
ls /usr/lib/*/libseccomp.so.2 /lib/*/libseccomp.so.2 /usr/lib64/libseccomp.so.2 >/dev/null 2>&1 || need="$need libseccomp2"
[ -z "$need" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
else
    echo "synthloop: not root and no sudo, so $need cannot be installed here; untrusted code will be refused" >&2
    exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
    $sudo apt-get install -y -q $need >/dev/null 2>&1 ||
        { $sudo apt-get update -q >/dev/null 2>&1 && $sudo apt-get install -y -q $need >/dev/null 2>&1; }
elif command -v dnf >/dev/null 2>&1; then
    $sudo dnf install -y -q bubblewrap libseccomp >/dev/null 2>&1
fi
command -v bwrap >/dev/null 2>&1 ||
    echo "synthloop: could not install $need; untrusted code will be refused until it is installed" >&2
exit 0
