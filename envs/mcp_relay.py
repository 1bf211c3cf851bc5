"""Inside an MCP server's sandbox: starts a Streamable HTTP server and relays its messages to and from stdio.

Run by the sandbox launcher as ``mcp_relay.py CONFIG_JSON`` (``{"url": ..., "argv": [...], "start_timeout": s}``),
standard library only, never imported by the caller. The server listens on the sandbox's own loopback (its network
namespace has no other interface, so every instance may use the same port and none is reachable from outside);
the caller speaks newline-delimited JSON-RPC to this relay exactly as to a stdio server, and parses what comes back
as untrusted, as it does for any server. Each line from stdin is POSTed to the URL (with the ``Mcp-Session-Id`` the
server gave at ``initialize``); a JSON answer is written as one line, an event stream as one line per message; an
HTTP error becomes a JSON-RPC error for the request; the server's exit ends the relay with its status.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse


def out(message):
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def error(request, code, text):
    if isinstance(request, dict) and "id" in request and "method" in request:
        out({"jsonrpc": "2.0", "id": request["id"], "error": {"code": code, "message": text}})


def accepts(host, port):
    """Whether something listens on host:port.

    A connection to an unlistened loopback port in the ephemeral range can succeed by TCP simultaneous open when
    the kernel happens to pick that same port as the source; such a socket is connected to itself, not a server.
    """
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            return sock.getsockname() != sock.getpeername()
    except OSError:
        return False


def wait_listening(host, port, server, deadline):
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.stderr.write(f"mcp-relay: the server exited with status {server.returncode} before listening\n")
            os._exit(server.returncode if server.returncode > 0 else 1)
        if accepts(host, port):
            return
        time.sleep(0.05)
    sys.stderr.write(f"mcp-relay: nothing listens on {host}:{port} after the start timeout\n")
    os._exit(1)


def events(response):
    """The ``data`` of each server-sent event, as one string per event."""
    data = []
    for raw in response:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        yield "\n".join(data)


def main():
    config = json.loads(sys.argv[1])
    url = urllib.parse.urlsplit(config["url"])
    host, port = url.hostname or "127.0.0.1", url.port or 80
    path = url.path or "/"
    server = subprocess.Popen(config["argv"], stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                              stderr=sys.stderr.fileno(), close_fds=True)
    wait_listening(host, port, server, time.monotonic() + config.get("start_timeout", 60))
    session, version = None, None
    for line in sys.stdin:
        if server.poll() is not None:
            break
        try:
            request = json.loads(line)
        except ValueError:
            continue
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if session:
            headers["Mcp-Session-Id"] = session
        if version:
            headers["MCP-Protocol-Version"] = version
        try:
            conn = http.client.HTTPConnection(host, port, timeout=config.get("call_timeout", 300))
            conn.request("POST", path, body=line.encode(), headers=headers)
            response = conn.getresponse()
        except OSError as exc:
            error(request, -32000, f"HTTP request to the server failed: {exc}")
            continue
        if response.getheader("Mcp-Session-Id"):
            session = response.getheader("Mcp-Session-Id")
        kind = (response.getheader("Content-Type") or "").split(";")[0].strip()
        if response.status >= 400:
            error(request, -32000, f"HTTP {response.status} {response.reason}: {response.read(500).decode('utf-8', 'replace')}")
        elif kind == "text/event-stream":
            for data in events(response):
                try:
                    message = json.loads(data)
                except ValueError:
                    continue
                out(message)
                result = message.get("result") if isinstance(message, dict) else None
                if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                    version = result["protocolVersion"]
                if isinstance(message, dict) and message.get("id") == request.get("id") and "method" not in message:
                    break
        elif kind == "application/json":
            body = response.read()
            try:
                message = json.loads(body)
            except ValueError:
                error(request, -32700, f"the server answered malformed JSON: {body[:200]!r}")
            else:
                for each in message if isinstance(message, list) else [message]:
                    out(each)
                    result = each.get("result") if isinstance(each, dict) else None
                    if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                        version = result["protocolVersion"]
        else:
            response.read()
        conn.close()
    server.kill()
    server.wait()
    os._exit(server.returncode if server.returncode and server.returncode > 0 else 0)


if __name__ == "__main__":
    main()
