"""Reading a user's files on the host: streamed, capped, never through a link out of their folder.

A plugin's package, an MCP server's state folder and a catalog are hashed into a run's id (and a catalog is
parsed) by this process, outside the sandbox, so what they hold is untrusted data reaching the host. A sparse
file of 20 GB costs nothing to make and a ``read_bytes()`` of it is a ``MemoryError``; a link to ``/etc/shadow``
or ``/dev/zero`` in a downloaded package would be read as if it were the package's. So every such read goes
through here:

- a file's size is checked (``fstat``) before a byte is read, and it is read in chunks, never whole into memory
  to be hashed; one that grows past its cap while read is refused too;
- a folder is walked without following links: a symbolic link counts as its target's *name* (what the worker
  inside the sandbox would see, where a link out of the package points at nothing), never its content;
  devices, FIFOs and sockets count by kind only and are never opened;
- a folder is capped in files, total bytes and depth, checked as it is walked, so a refusal comes in
  milliseconds, before anything big is read.

A refusal is :class:`FileRefused`, one line naming the file, what it is, the cap and what to do.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

CHUNK = 1 << 20


class FileRefused(ValueError):
    """A user's file or folder is over a cap, or is not a plain file; the message names it and the cap.

    Attributes:
        path: The file or folder refused.
        reason: The message without the path (``"20 GiB (...), over the cap of 64 MiB for ..."``), for a caller
            that names files its own way.
    """

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class FileCaps:
    """What one user's folder (or file) may hold before the host refuses to read it.

    Attributes:
        file_bytes: Largest single file.
        total_bytes: All files of the folder together.
        files: Entries (files, links, folders, ...) in the folder.
        depth: Levels of folders below the root.
    """

    file_bytes: int = 64 << 20
    total_bytes: int = 256 << 20
    files: int = 10_000
    depth: int = 32


def size_text(n: int) -> str:
    """``20 GiB``, ``64 MiB``, ``512 bytes``: a size as a person reads it in a refusal."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) or value >= 100 else f"{value:.1f} {unit}"
    return f"{n} bytes"


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def _open_regular(path: str, follow: bool) -> tuple[int, os.stat_result]:
    # O_NONBLOCK: a FIFO put there after the caller looked must not hang the open; O_NOFOLLOW: nor a link
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise FileRefused(path, "cannot be read: it is a symbolic link, which is not followed here") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FileRefused(path, f"cannot be read: it is {_kind(st.st_mode)}, not a regular file; give a file")
    return fd, st


def _chunks(fd: int, path: str, limit: int, what: str):
    """The file's bytes in chunks; FileRefused once more than ``limit`` bytes came (it grew while read)."""
    seen = 0
    while chunk := os.read(fd, CHUNK):
        seen += len(chunk)
        if seen > limit:
            raise FileRefused(path, f"grew past {size_text(limit)} while read, the cap of {what}; "
                              "leave it unchanged while the run reads it")
        yield chunk


def read_capped(path: str | os.PathLike, limit: int, *, what: str = "one file", follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``, refused unread if it is larger than ``limit``.

    Args:
        path: The file. A link is followed only with ``follow`` (a file the user named themselves).
        limit: The largest size accepted, in bytes.
        what: What the cap is of, for the refusal (``"a catalog file (generators.catalog.MAX_FILE_BYTES)"``).

    Raises:
        FileRefused: over ``limit`` (by its size, before reading), or not a regular file (a device, a FIFO).
        OSError: it cannot be opened.
    """
    path = os.fspath(path)
    fd, st = _open_regular(path, follow)
    try:
        if st.st_size > limit:
            raise FileRefused(path, f"{size_text(st.st_size)} ({st.st_size:,} bytes), over the cap of "
                              f"{size_text(limit)} for {what}; make it smaller")
        return b"".join(_chunks(fd, path, limit, what))
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def hash_tree(root: str | os.PathLike, digest: _Digest, *, caps: FileCaps = FileCaps(), what: str = "the folder",
              skip: Callable[[tuple[str, ...]], bool] | None = None) -> int:
    """Feed what ``root`` (a folder, or one file) holds into ``digest``; returns the bytes of content hashed.

    Entries are taken in the order of their relative paths' parts (``sorted`` of ``Path`` objects). A regular
    file adds ``"<relative path>\\0<size>\\0"`` and its bytes (a one-file root: its name); a symbolic link adds
    ``"<relative path>\\0-> <target>\\0"`` and is never followed; any other kind (a device, a FIFO, a socket) adds
    ``"<relative path>\\0<kind>\\0"`` and is never opened. Folders add nothing themselves and links to folders
    are not entered. ``skip(parts)`` leaves out an entry (and a folder's whole content).

    Raises:
        FileRefused: a file, the folder's total, its number of entries or its depth is over ``caps``; the
            message names the entry and the cap. Checked before the content of what is over it is read.
        OSError: ``root`` or an entry cannot be read.
    """
    root = os.fspath(root)
    top = os.lstat(root)
    if not stat.S_ISDIR(top.st_mode):
        name = os.path.basename(root)
        if stat.S_ISLNK(top.st_mode):
            digest.update(f"{name}\0-> {os.readlink(root)}\0".encode("utf-8", "surrogateescape"))
            return 0
        return _hash_file(root, name, top, digest, caps, what, caps.total_bytes)
    entries: list[tuple[tuple[str, ...], str, os.stat_result]] = []
    pending: list[tuple[tuple[str, ...], str]] = [((), root)]
    seen = 0
    while pending:
        parts, folder = pending.pop()
        with os.scandir(folder) as listing:
            for entry in listing:
                rel = (*parts, entry.name)
                if skip is not None and skip(rel):
                    continue
                seen += 1
                if seen > caps.files:
                    raise FileRefused(root, f"{what} holds more than {caps.files:,} entries, the cap; "
                                      "keep only what it needs in it")
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if len(rel) > caps.depth:
                        raise FileRefused(entry.path, f"{len(rel)} folders deep in {what}, over the cap of "
                                          f"{caps.depth}; flatten it")
                    pending.append((rel, entry.path))
                else:
                    entries.append((rel, entry.path, st))
    entries.sort(key=lambda e: e[0])
    total = sum(st.st_size for _, _, st in entries if stat.S_ISREG(st.st_mode))
    if total > caps.total_bytes:  # refused from the sizes alone: nothing big is read first
        biggest = max((e for e in entries if stat.S_ISREG(e[2].st_mode)), key=lambda e: e[2].st_size)
        if biggest[2].st_size > caps.file_bytes:
            _too_big(biggest[1], biggest[2].st_size, caps, what)
        raise FileRefused(root, f"{what} holds {size_text(total)} in files, over the cap of "
                          f"{size_text(caps.total_bytes)}; keep only what it needs in it")
    hashed = 0
    for rel, path, st in entries:
        name = "/".join(rel)
        if stat.S_ISLNK(st.st_mode):
            digest.update(f"{name}\0-> {os.readlink(path)}\0".encode("utf-8", "surrogateescape"))
        elif stat.S_ISREG(st.st_mode):
            hashed += _hash_file(path, name, st, digest, caps, what, caps.total_bytes - hashed)
        else:
            digest.update(f"{name}\0{_kind(st.st_mode)}\0".encode("utf-8", "surrogateescape"))
    return hashed


def _too_big(path: str, size: int, caps: FileCaps, what: str):
    raise FileRefused(path, f"{size_text(size)} ({size:,} bytes), over the cap of {size_text(caps.file_bytes)} "
                      f"for one file of {what}; keep large data out of it")


def _hash_file(path: str, name: str, st: os.stat_result, digest: _Digest, caps: FileCaps, what: str,
               left: int) -> int:
    if st.st_size > caps.file_bytes:
        _too_big(path, st.st_size, caps, what)
    fd, opened = _open_regular(path, follow=False)
    try:
        if opened.st_size > caps.file_bytes:  # swapped for a bigger one since it was listed
            _too_big(path, opened.st_size, caps, what)
        digest.update(f"{name}\0{opened.st_size}\0".encode("utf-8", "surrogateescape"))
        n = 0
        for chunk in _chunks(fd, path, min(caps.file_bytes, left), what):
            digest.update(chunk)
            n += len(chunk)
        return n
    finally:
        os.close(fd)
