"""Jobs as Ray tasks on an existing cluster: the same unit (`stages.contract.execute`) the local runner places.

`synthesize(..., ray="127.0.0.1:6379" | "auto")` connects to a running cluster (`ray start --head`, more nodes
with `ray start --address …`) and submits one task per job not yet done; the flow waits for them as they
finish. A batch is a config and an index in and shards out, written whole before its done-marker, so the corpus
does not depend on where a batch ran (tested: identical rows to the local runner), and a worker that dies mid-batch
(killed, out of memory, its node lost) has its task retried by Ray (`max_retries`) with nothing of the first
attempt counted. Every node must see the corpus root at the same path (one machine, or a shared file system) and
the project installed in the Python that runs its Ray worker (the venv `ray start` was run from). Endpoint URLs
are passed as they are: the embedded model's server listens on 127.0.0.1 of the flow's machine, so nodes on other
machines need a reachable endpoint (`agents.endpoints.*.base_url`) instead.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

from generators.llm import EndpointUnavailable
from stages.contract import Job, JobContext, Stage, execute


class ClusterUnreachable(ConnectionError):
    """No Ray cluster answers at the address given; the message names it and says how to start one."""


def check_cluster(address: str, timeout: float = 5.0) -> None:
    """Fails in seconds where nothing listens at ``host:port`` (``ray.init`` would wait minutes, then exit the
    process); ``auto`` and ``ray://`` addresses are left to Ray.

    Raises:
        ClusterUnreachable: nothing answers at ``address``.
    """
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        raise ClusterUnreachable(f"no Ray cluster answers at {address!r} ({exc}); start one with `ray start --head "
                                 f"--port PORT` and give its host:port, or `auto` for the one on this machine") from None


MAX_RETRIES = 3
"""Attempts after the first for a batch whose worker died, or whose model endpoint gave out."""


def ray_jobs(stage: Stage, jobs: list[Job], context: JobContext, address: str,
             max_retries: int = MAX_RETRIES) -> Iterator[dict[str, Any]]:
    """Each job's info as it finishes on the cluster at ``address`` (``auto``: the one running here).

    Raises:
        ClusterUnreachable: no cluster answers at ``address``; the message names it.
    """
    import ray

    check_cluster(address)
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, logging_level="warning",
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError, SystemExit) as exc:  # Ray exits when its GCS never answers
        raise ClusterUnreachable(f"no Ray cluster at {address!r}: {exc} (start one with `ray start --head`, or give "
                                 f"its address)") from None
    remote = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=[EndpointUnavailable])(execute)
    pending = {remote.remote(stage, job, context): job for job in jobs}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                job = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except ray.exceptions.RayError as exc:
                    cause = getattr(exc, "cause", None)
                    raise RuntimeError(f"{job.title} failed on the Ray cluster at {address}: "
                                       f"{cause if cause is not None else exc}") from None
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        ray.shutdown()
