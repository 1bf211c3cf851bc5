"""Reference and negative-control episodes for the verifier tests, played as ``stages.synthesize`` plays them."""

from __future__ import annotations

import random

from envs import Environment
from generators.agents import OracleAssistant, ScriptedUser, run_episode
from schemas import Task, Trajectory
from schemas.controls import Control
from verifiers.controls import make_controls


def play_reference(task: Task, env: Environment, *, parallel: bool = False) -> tuple[Trajectory, Environment]:
    """The reference trajectory, played on a fork of ``env``, and that fork in the state it left."""
    final = env.fork()
    reference = run_episode(task, ScriptedUser(task), OracleAssistant(task, parallel=parallel), final,
                            role="reference", trajectory_id=f"{task.task_id}-reference")
    return reference, final


def play_controls(task: Task, env: Environment, final: Environment, rng: random.Random, *,
                  parallel: bool = False) -> list[tuple[Control, Trajectory]]:
    """Each control ``make_controls`` makes for the task, with its trajectory (role: the control's kind)."""
    return [(control, run_episode(task, ScriptedUser(task), OracleAssistant(task, parallel=parallel, fault=control),
                                  env.fork(), role=control.kind, trajectory_id=f"{task.task_id}-{control.kind}"))
            for control in make_controls(task, env, final, rng)]
