"""Verification cost against conversation length: ``verify`` on 1k, 10k and 20k-message conversations.

    python benchmarks/verify_long.py [--domain retail] [--sizes 1000 10000 20000] [--repeat 3]

A long conversation is a real task's reference trajectory padded, right after its first read-only call, with
rounds of "check that again": a user turn (numbered), the same call again, its real tool message and an
assistant turn restating the result and the user's number. Every padded call is real and grounded, so every part of the
verifier does its full work (replay, grounding, observations, answer matching over a long answer text).
Prints the seconds per ``verify`` for each size and the ratio of the 10k to the 1k time: linear cost gives
about 10, quadratic about 100.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs import DOMAINS, Environment  # noqa: E402
from generators.agents import OracleAssistant, ScriptedUser, run_episode  # noqa: E402
from generators.tasks import sample_tasks  # noqa: E402
from schemas import Message, Task, Trajectory  # noqa: E402
from verifiers.checks import NUMBER, verify  # noqa: E402

ROUND = 4  # messages added per padding round


def reference_with_a_read(domain: str, seed: int = 17) -> tuple[Task, Trajectory, Environment, int]:
    """A sampled task of ``domain``, its reference trajectory, the environment and the index of the tool
    message of its first read-only call whose result holds numbers (the first such task in the sample):
    numbers make answer matching do its full work."""
    env = Environment(DOMAINS[domain], 0)
    for task, _ in sample_tasks(env, 40, seed=seed, run_id="bench"):
        ref = run_episode(task, ScriptedUser(task), OracleAssistant(task), env.fork(), role="reference",
                          trajectory_id=f"{task.task_id}-reference")
        for i, m in enumerate(ref.messages):
            calls = m.get("tool_calls") or []
            if len(calls) == 1 and not env.specs[calls[0]["function"]["name"]].mutates and \
                    len(NUMBER.findall(ref.messages[i + 1]["content"])) >= 3:
                return task, ref, env, i + 1
    raise SystemExit(f"no sampled {domain} task has a read-only call returning numbers; try another --domain")


def padded(reference: Trajectory, after: int, n_messages: int) -> Trajectory:
    """``reference`` grown to about ``n_messages`` messages by repeating the read-only call whose tool
    message is ``reference.messages[after]`` (the state there is unchanged, so its result is the same)."""
    call = reference.messages[after - 1]["tool_calls"][0]
    result = reference.messages[after]["content"]
    rounds = max(0, (n_messages - len(reference.messages)) // ROUND)
    extra: list[Message] = []
    for k in range(rounds):
        cid = f"call_again_{k}"
        extra += [
            {"role": "user", "content": f"Could you check that again, please? (try {k + 1})"},
            {"role": "assistant", "content": "", "tool_calls": [{**copy.deepcopy(call), "id": cid}]},
            {"role": "tool", "tool_call_id": cid, "name": call["function"]["name"], "content": result},
            {"role": "assistant", "content": f"This is check number {k + 1}, and it is unchanged. {_summary(result)}"},
        ]
    messages = reference.messages[: after + 1] + extra + reference.messages[after + 1:]
    return Trajectory(**{**reference.__dict__, "messages": messages,
                         "trajectory_id": f"{reference.trajectory_id}-x{len(messages)}"})


def _summary(content: str) -> str:
    data = json.loads(content)
    rows = data if isinstance(data, list) else [data]
    return " ".join(", ".join(f"{k}: {v}" for k, v in sorted(r.items()) if not isinstance(v, (dict, list))) + "."
                    if isinstance(r, dict) else f"{r}." for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", default="retail", choices=sorted(DOMAINS))
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 20000])
    p.add_argument("--repeat", type=int, default=3, help="verifications per size (the fastest is reported)")
    a = p.parse_args()
    task, reference, env, after = reference_with_a_read(a.domain)
    print(f"task {task.task_id} ({a.domain}): reference of {len(reference.messages)} messages, padded after "
          f"message {after}")
    seconds: dict[int, float] = {}
    for size in a.sizes:
        trajectory = padded(reference, after, size)
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            verdict = verify(task, trajectory, env)
            best = min(best, time.perf_counter() - t0)
        seconds[size] = best
        failed = [c.name for c in verdict.components if not c.passed]
        print(f"{len(trajectory.messages):>7} messages  {len(trajectory.tool_calls):>6} calls  {best:8.3f} s/verify  "
              f"failed: {', '.join(failed) or '-'}")
    if 1000 in seconds and 10000 in seconds:
        print(f"ratio 10k/1k: {seconds[10000] / seconds[1000]:.1f} (linear ~10, quadratic ~100)")


if __name__ == "__main__":
    main()
