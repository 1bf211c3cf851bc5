#!/bin/sh
# Installs the operating-system packages behind synthloop's sandbox boundary: bubblewrap (the namespaces) and
# libseccomp2 (the system-call filter). Without them everything runs except untrusted code (LLM-written checks,
# plugins, third-party servers), which is refused with a message saying what to install. With `test` (the test
# command) also Debian's chromium and chromium-driver, the real browser the viewer's tests drive (tests/viewer);
# without them those tests skip (fail under CI). Never fails the caller.
need=""
command -v bwrap >/dev/null 2>&1 || [ -x /usr/bin/bwrap ] || need="bubblewrap"
ls /usr/lib/*/libseccomp.so.2 /lib/*/libseccomp.so.2 /usr/lib64/libseccomp.so.2 >/dev/null 2>&1 || need="$need libseccomp2"
browser=""
if [ "${1:-}" = test ]; then
    [ -x /usr/bin/chromium ] || browser="chromium"
    [ -x /usr/bin/chromedriver ] || browser="$browser chromium-driver"
fi
[ -z "$need$browser" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
else
    echo "synthloop: not root and no sudo, these cannot be installed here: $need $browser${need:+; untrusted code will be refused}" >&2
    exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
    # one list per purpose, so a missing browser package never costs the sandbox its packages
    for pkgs in "$need" "$browser"; do
        [ -z "$pkgs" ] && continue
        $sudo apt-get install -y -q $pkgs >/dev/null 2>&1 ||
            { $sudo apt-get update -q >/dev/null 2>&1 && $sudo apt-get install -y -q $pkgs >/dev/null 2>&1; }
    done
elif command -v dnf >/dev/null 2>&1; then
    [ -n "$need" ] && $sudo dnf install -y -q bubblewrap libseccomp >/dev/null 2>&1
fi
[ -z "$need" ] || command -v bwrap >/dev/null 2>&1 ||
    echo "synthloop: could not install $need; untrusted code will be refused until it is installed" >&2
[ -z "$browser" ] || [ -x /usr/bin/chromedriver ] ||
    echo "synthloop: could not install $browser; the viewer's browser tests will skip" >&2
exit 0
