"""What an s3:// corpus root costs against a local folder, on moto's S3 server over loopback HTTP.

    python benchmarks/object_store.py [--batches 4] [--batch-size 50]

The rows of the same synthesize batches (retail, scripted agents) are committed by ``Corpus.write_batch`` in this
process, once into a local folder and once into ``s3://bench/run`` on a ``python -m moto.server`` subprocess (the commit
protocol of ``storage.object_store``: every shard PUT, its size read back, the marker PUT last). Then the corpus is
read from a cold mirror (every marker and shard downloaded and hashed), from a warm one (one LIST), and checked by
the doctor; the local corpus is read and checked the same way. Prints seconds for each and checks that both hold
the same tasks. moto keeps objects in memory on this machine, so the figures are the protocol's cost (requests,
hashing, the mirror), not a network's.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from generators.config import SynthesizeConfig  # noqa: E402
from stages.contract import JobContext  # noqa: E402
from stages.synthesize import SynthesizeStage  # noqa: E402
from storage import Corpus  # noqa: E402
from storage.integrity import diagnose  # noqa: E402
from storage.object_store import diagnose_objects  # noqa: E402


def moto(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=50)
    args = parser.parse_args()
    config = SynthesizeConfig(n_tasks=args.batches * args.batch_size, batch_size=args.batch_size,
                              run_name="s3bench", domains=["retail"], agents={"llm_tasks": 0})
    stage = SynthesizeStage(config)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="synthloop-s3bench-") as tmp:
        os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                          AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
                          SYNTHLOOP_OBJECT_MIRROR=f"{tmp}/writer")
        server = moto(port)
        try:
            import boto3

            boto3.client("s3").create_bucket(Bucket="bench")
            local, url = f"{tmp}/local", "s3://bench/run"
            corpora = {local: Corpus(local), url: Corpus(url)}
            write = {local: 0.0, url: 0.0}
            for job in stage.plan(corpora[local]):
                result = stage.run(job, JobContext(local))
                order = list(corpora.items())[:: 1 if job.batch % 2 else -1]  # who goes first alternates
                for root, corpus in order:  # the same rows committed both ways
                    write[root] += timed(lambda c=corpus, j=job, r=result: c.write_batch(
                        stage.run_id, j.stage, j.batch, r.tables, r.summary))[0]
            read_local, n_local = timed(lambda: len(Corpus(local).read("trajectories")))
            os.environ["SYNTHLOOP_OBJECT_MIRROR"] = f"{tmp}/reader"
            read_cold, n_cold = timed(lambda: len(Corpus(url).read("trajectories")))
            read_warm, _ = timed(lambda: len(Corpus(url).read("trajectories")))
            doctor_local, _ = timed(lambda: diagnose(Corpus(local)))
            doctor_s3, (_, damaged) = timed(lambda: diagnose_objects(Corpus(url)))
            same = sorted(r["task_id"] for r in Corpus(local).read("tasks")) == \
                sorted(r["task_id"] for r in Corpus(url).read("tasks"))
        finally:
            server.terminate()
            server.wait(timeout=10)
    n = config.n_batches
    print(f"{n} batches of {args.batch_size} tasks (retail, scripted agents); {n_local} trajectories; same tasks: "
          f"{same and n_cold == n_local}; doctor found damage on s3: {damaged}")
    print("| step | local folder (s) | s3:// on moto (s) | s3 − local (s) |")
    print("|---|---|---|---|")
    print(f"| commit {n} batches (write_batch) | {write[local]:.3f} | {write[url]:.3f} | "
          f"{write[url] - write[local]:+.3f} |")
    print(f"| read trajectories, cold mirror | {read_local:.3f} | {read_cold:.3f} | {read_cold - read_local:+.3f} |")
    print(f"| read trajectories, warm mirror | {read_local:.3f} | {read_warm:.3f} | {read_warm - read_local:+.3f} |")
    print(f"| doctor (sha256 of every shard) | {doctor_local:.3f} | {doctor_s3:.3f} | "
          f"{doctor_s3 - doctor_local:+.3f} |")


if __name__ == "__main__":
    main()
