#!/bin/sh
# Reference MCP servers from PyPI (each in its own virtual environment) and npm, for tests and for `--mcp` runs.
#
#   sh scripts/mcp-servers.sh            # all of them
#   sh scripts/mcp-servers.sh sqlite     # one of them (sqlite | time | git | memory | filesystem | everything)
#
# memory, filesystem and everything are @modelcontextprotocol/server-memory, server-filesystem and server-everything
# (the protocol's reference server, which also speaks Streamable HTTP) from the npm registry, run by the system's node (v20 here); each is
# installed with `npm install --save-exact --ignore-scripts --before=$NPM_BEFORE` into <dir>/node_modules, so the
# top-level version is pinned exactly and every transitive one is what the registry offered at that date (the same
# tree on every machine); <dir>/package-lock.json records it, <dir>/bin/mcp-server-<name> links to its script and
# <dir>/node_modules/.bin/mcp-server-<name> is npm's own link (what a user who ran `npm install` passes to --mcp).
#
# Each server gets ${SYNTHLOOP_MCP_HOME:-$HOME/.cache/synthloop/mcp}/<name>-<version>/, created with the base
# interpreter the sandbox exposes (the venv's python links to it), so the server runs inside the boundary with
# nothing but its venv made visible. The servers' pins clash (git/time need mcp>=2.3,<3; sqlite needs the 1.x
# API), hence one venv each. Every dependency is pinned below, so two machines build the same environments.
# Idempotent: a venv whose pins are already installed is left alone. It never fails its caller (exit 0); it
# prints what it did, and a server it could not install is simply missing (tests that need it skip).

HERE=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${SYNTHLOOP_MCP_HOME:-${HOME:-/root}/.cache/synthloop/mcp}

# The base interpreter: the one behind the project's venv (what sandbox.boundary.python_executable() returns).
if [ -n "$SYNTHLOOP_PYTHON" ]; then
    PY=$SYNTHLOOP_PYTHON
elif [ -x "$HERE/.venv/bin/python" ]; then
    PY=$("$HERE/.venv/bin/python" -c 'import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))')
else
    PY=$(command -v python3)
fi

pins() {
    case "$1" in
        sqlite) echo "mcp-server-sqlite==2025.4.25 mcp[cli]==1.30.0 $SQLITE_DEPS" ;;
        time) echo "mcp-server-time==2026.10.19 mcp==2.3.0 tzdata==2026.6 tzlocal==5.4.5 $MCP2_DEPS" ;;
        git) echo "mcp-server-git==2026.10.19 mcp==2.3.0 gitpython==3.2.1 $MCP2_DEPS $GIT_DEPS" ;;
    esac
}
version() {
    case "$1" in
        sqlite) echo 2025.4.25 ;;
        time|git) echo 2026.10.19 ;;
    esac
}
# Transitive pins (what pip resolved on 2026-12-02 from the top-level pins above), so a rebuild gives the same venv.
SQLITE_DEPS="annotated-doc==0.0.7 annotated-types==0.8.0 anyio==4.16.0 attrs==26.1.0 certifi==2026.10.19.post1 cffi==2.1.1 click==8.5.1 cryptography==50.0.2 h11==0.16.0 httpcore==1.0.9 httpx==0.28.1 httpx-sse==0.4.3 idna==3.20 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 markdown-it-py==4.3.0 mdurl==0.1.2 pycparser==3.12 pydantic==2.14.4 pydantic-settings==2.16.3 pydantic_core==2.50.5 Pygments==2.21.0 PyJWT==2.15.1 python-dotenv==1.2.4 python-multipart==0.0.34 referencing==0.37.0 rich==15.0.0 rpds-py==2026.9.1 shellingham==1.5.4 sse-starlette==3.7.0 starlette==1.10.0 typer==0.29.2 typing-inspection==0.4.5 typing_extensions==4.16.0 uvicorn==0.54.0"
MCP2_DEPS="annotated-types==0.8.0 anyio==4.16.0 attrs==26.1.0 cffi==2.1.1 click==8.5.1 cryptography==50.0.2 h11==0.16.0 httpcore2==2.16.2 httpx2==2.16.2 idna==3.20 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 mcp-types==2.3.0 opentelemetry-api==1.45.2 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5 PyJWT==2.15.1 python-multipart==0.0.34 referencing==0.37.0 rpds-py==2026.9.1 sse-starlette==3.7.0 starlette==1.10.0 truststore==0.10.5 typing-inspection==0.4.5 typing_extensions==4.16.0 uvicorn==0.54.0"
GIT_DEPS="gitdb==4.0.12 smmap==5.0.3"

install_one() {
    name=$1
    dir="$ROOT/$name-$(version "$name")"
    want=$(pins "$name")
    marker="python=$PY $want"  # a venv made from another interpreter, or with other pins, is rebuilt
    if [ -f "$dir/.synthloop-pins" ] && [ "$(cat "$dir/.synthloop-pins")" = "$marker" ] && [ -x "$dir/bin/python" ]; then
        echo "mcp-servers: $name already installed in $dir"
        return 0
    fi
    echo "mcp-servers: installing $name into $dir ($(echo "$want" | wc -w) pinned packages)"
    rm -rf "$dir"
    mkdir -p "$ROOT" || { echo "mcp-servers: cannot create $ROOT; $name not installed"; return 0; }
    if ! "$PY" -m venv "$dir" >/dev/null 2>&1; then
        echo "mcp-servers: '$PY -m venv' failed; $name not installed"
        rm -rf "$dir"
        return 0
    fi
    # shellcheck disable=SC2086  # the pins are separate words
    if "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input $want >"$dir/.install.log" 2>&1; then
        echo "$marker" >"$dir/.synthloop-pins"
        "$dir/bin/python" -m pip freeze --disable-pip-version-check >"$dir/.synthloop-freeze" 2>/dev/null
        echo "mcp-servers: $name installed ($(wc -l <"$dir/.synthloop-freeze") packages, see $dir/.synthloop-freeze)"
    else
        echo "mcp-servers: pip could not install $name (no network to PyPI?); last lines of $dir/.install.log:"
        tail -n 5 "$dir/.install.log" | sed 's/^/    /'
        mv "$dir/.install.log" "$ROOT/$name.failed.log" 2>/dev/null
        rm -rf "$dir"
    fi
    return 0
}

NPM_BEFORE=2026-12-02T00:00:00Z
npm_package() {
    case "$1" in
        memory) echo "@modelcontextprotocol/server-memory 2026.8.31 mcp-server-memory" ;;
        filesystem) echo "@modelcontextprotocol/server-filesystem 2026.8.31 mcp-server-filesystem" ;;
        everything) echo "@modelcontextprotocol/server-everything 2026.8.31 mcp-server-everything" ;;
    esac
}
install_npm() {
    name=$1
    # shellcheck disable=SC2046  # three words: package, version, the script's name
    set -- $(npm_package "$name")
    package=$1 pversion=$2 bin=$3
    dir="$ROOT/$name-$pversion"
    node=$(command -v node)
    npm=$(command -v npm)
    if [ -z "$node" ] || [ -z "$npm" ]; then
        echo "mcp-servers: node or npm is not on PATH; $name not installed"
        return 0
    fi
    marker="node=$("$node" --version) $package@$pversion before=$NPM_BEFORE"
    if [ -f "$dir/.synthloop-pins" ] && [ "$(cat "$dir/.synthloop-pins")" = "$marker" ] && [ -x "$dir/bin/$bin" ]; then
        echo "mcp-servers: $name already installed in $dir"
        return 0
    fi
    echo "mcp-servers: installing $name ($package@$pversion, npm as of $NPM_BEFORE) into $dir"
    rm -rf "$dir"
    mkdir -p "$dir/bin" || { echo "mcp-servers: cannot create $dir; $name not installed"; return 0; }
    echo "{\"name\": \"synthloop-mcp-$name\", \"private\": true}" >"$dir/package.json"
    if (cd "$dir" && "$npm" install --save-exact --ignore-scripts --no-audit --no-fund --before="$NPM_BEFORE" \
            "$package@$pversion") >"$dir/.install.log" 2>&1 \
       && [ -f "$dir/node_modules/$package/dist/index.js" ]; then
        ln -s "../node_modules/$package/dist/index.js" "$dir/bin/$bin"
        (cd "$dir" && "$npm" ls --all --parseable --long 2>/dev/null | sed "s|^$dir/*||" >"$dir/.synthloop-freeze")
        echo "$marker" >"$dir/.synthloop-pins"
        echo "mcp-servers: $name installed ($(grep -c node_modules "$dir/.synthloop-freeze") packages, see $dir/package-lock.json)"
    else
        echo "mcp-servers: npm could not install $name (no network to the npm registry?); last lines of $dir/.install.log:"
        tail -n 5 "$dir/.install.log" | sed 's/^/    /'
        mv "$dir/.install.log" "$ROOT/$name.failed.log" 2>/dev/null
        rm -rf "$dir"
    fi
    return 0
}

names=${*:-sqlite time git memory filesystem everything}
for n in $names; do
    case "$n" in
        sqlite|time|git) install_one "$n" ;;
        memory|filesystem|everything) install_npm "$n" ;;
        *) echo "mcp-servers: unknown server '$n' (known: sqlite time git memory filesystem everything)" ;;
    esac
done
exit 0
