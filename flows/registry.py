"""The registries of the two axes the command line and the server are built from: stages and exports.

**Stages.** One ``StageSpec`` per top-level stage in ``STAGES``, in the order a repair redoes their runs (a
curate run reads synthesize runs, a train run reads both). The CLI's config commands, their option shortcuts
and extra mappers, the per-command failures of ``exit_status``, ``serve``'s flows and deployments and
``repair``'s rerun all read it; ``storage.integrity.STAGE_ORDER`` and ``viewer.app.STAGE_PLOTS`` sit in lower
layers that cannot import this one, and ``tests/test_extension_contracts.py`` proves they name the same stages.

Everything a spec points to is a ``"module:attribute"`` reference, imported when used: the CLI imports only the
command being run (the other commands stay fast, and need not have Prefect or the training extra importable).

**Exports.** ``EXPORTS``: name → ``Export`` (the writer and the options it takes); ``export``'s choices and
``cmd_export`` read it. Every named selection (``storage.selections.SELECTIONS``) is an export of its own.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from flows.options import Shortcut
from storage.selections import SELECTIONS


def resolve(ref: str) -> Any:
    """The object a ``"module:attribute"`` reference names (imported now)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class StageSpec:
    """A stage as the command line, the server and repair see it.

    ``stage`` is its ``stages.contract.Stage`` class, ``config`` the config model its flow takes as ``config``
    and its command's options are generated from, ``flow`` the Prefect flow (``flows/<name>.py``). ``inputs``:
    manifest keys handed to the flow again on a rerun, besides the config (curate: the runs it read)."""

    name: str
    stage: str
    config: str
    description: str
    help: str = ""
    """The command's one line in ``synthloop --help``."""
    shortcuts: tuple[Shortcut, ...] = ()
    """Flags for nested fields under the names users already type; every other nested field is a --set key."""
    extra: str | None = None
    """A mapper ``(args, data) -> None`` for the command's options that are not fields of its config."""
    errors: tuple[str, ...] = ("builtins:ValueError",)
    """What a run raises about its inputs: exit status 2 with one line instead of a traceback."""
    inputs: tuple[str, ...] = ()
    scheduled: bool = False
    """Its deployment takes ``serve --cron``'s schedule (the others follow a run of it)."""
    corpus: str = "data/corpus"
    """Its command's default corpus; a deployment puts a corpus other than the default one beside the served one."""
    reads_corpus: bool = False
    """Its command refuses to start without a corpus to read."""
    training: bool = False
    """Its command refuses to start without the ``train`` extra installed."""
    endpoint_roles: str | None = None
    """What ``--base-url`` is the endpoint of, where its command takes one."""
    not_printed: tuple[str, ...] = ()
    """Keys of the run's summary its command leaves out of what it prints (long lists)."""

    @property
    def flow(self) -> str:
        return f"flows.{self.name}:{self.name}"

    def config_model(self) -> type:
        return resolve(self.config)

    def stage_class(self) -> type:
        return resolve(self.stage)

    def flow_function(self) -> Any:
        return resolve(self.flow)

    def error_types(self) -> tuple[type[BaseException], ...]:
        return tuple(resolve(ref) for ref in self.errors)

    def run_id(self, config: Any, inputs: dict[str, Any]) -> str:
        """The run id ``config`` gives with these inputs: config models spell it as a property (synthesize) or a
        method taking the inputs (curate: the runs it reads; train, loop: none)."""
        found = config.run_id
        return found if isinstance(found, str) else found(*inputs.values())


STAGES: dict[str, StageSpec] = {spec.name: spec for spec in (
    StageSpec("synthesize", "stages.synthesize:SynthesizeStage", "generators.config:SynthesizeConfig",
              "Synthesise a verified tool-use corpus on the built-in environments.",
              shortcuts=(Shortcut("--llm-tasks", "agents.llm_tasks", metavar="N"),),
              extra="flows.cli:synthesize_sources", errors=("generators.sources:SourceError",), scheduled=True),
    StageSpec("curate", "stages.curate:CurateStage", "stages.curate:CurateConfig",
              "Dedup, decontaminate and probe the corpus: necessity labels, min_calls, difficulty buckets.",
              shortcuts=(Shortcut("--no-tool-k", "necessity.k", metavar="K"),
                         Shortcut("--necessity-tasks", "necessity.max_tasks", metavar="N"),
                         Shortcut("--continuation", "necessity.continuation"),
                         Shortcut("--rollouts", "difficulty.k", metavar="K"),
                         Shortcut("--difficulty-tasks", "difficulty.max_tasks", metavar="N")),
              help="run the curate flow: dedup, decontamination, necessity and difficulty probes",
              extra="flows.cli:curate_endpoint", errors=("builtins:ValueError", "builtins:FileNotFoundError"),
              inputs=("sources",), reads_corpus=True, endpoint_roles="both probes", not_printed=("pass_rates",)),
    StageSpec("train", "stages.train:TrainStage", "training.config:TrainConfig",
              "Evaluate the base policy on held-out tasks, SFT it, GRPO it, evaluate after each stage.",
              help="run the train flow: evaluate the base policy, SFT on sft_v1, GRPO, evaluate after each stage",
              reads_corpus=True, training=True,
              shortcuts=(Shortcut("--max-steps", "sft.max_steps", metavar="N"),
                         Shortcut("--batch-size", "sft.batch_size", metavar="B"),
                         Shortcut("--policy", "sft.policy", metavar="DIR"),
                         Shortcut("--adapter", "sft.adapter"),
                         Shortcut("--grpo-steps", "grpo.max_steps", metavar="N"),
                         Shortcut("--group-size", "grpo.group_size", metavar="G"),
                         Shortcut("--engine", "grpo.engine"),
                         Shortcut("--eval-tasks", "evaluation.tasks", metavar="N"),
                         # after the stage's own shortcuts: skipping a stage wins over its settings
                         Shortcut("--no-sft", "sft", const=None),
                         Shortcut("--no-grpo", "grpo", const=None))),
    StageSpec("loop", "stages.loop:LoopStage", "stages.loop:LoopConfig",
              "Closed loop: rounds of synthesize → curate → train → select boundary tasks and failures → variants.",
              help="run the loop flow: rounds of synthesize → curate → train → select → variants",
              errors=("builtins:ValueError", "generators.sources:SourceError"), corpus="data/loop"),
)}

ALIASES = {"serve": "synthesize"}
"""Commands that build another stage's config: ``serve`` deploys synthesize runs of the config its options give."""


def stage_of(command: str) -> StageSpec | None:
    """The stage a command runs (or builds the config of), None for a command that is no stage."""
    return STAGES.get(ALIASES.get(command, command))


# --- exports ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Export:
    """A format ``synthloop export NAME --out FILE`` writes: ``write(corpus, out, **options)`` → rows written,
    taking those of the command's options (``run_id``, ``split``, ``query``) named in ``options``."""

    name: str
    write: str
    options: tuple[str, ...] = ()
    selection: str | None = None
    """A named selection's key (``storage.selections.SELECTIONS``), passed as the writer's second argument."""

    def __call__(self, corpus: Any, out: str, **given: Any) -> int:
        writer = resolve(self.write)
        kwargs = {k: v for k, v in given.items() if k in self.options}
        return writer(corpus, self.selection, out, **kwargs) if self.selection else writer(corpus, out, **kwargs)


EXPORTS: dict[str, Export] = {e.name: e for e in (
    Export("trl", "storage.exports:export_trl", options=("run_id",)),
    *(Export(name, "storage.exports:export_selection", selection=name) for name in SELECTIONS),
    Export("verl", "interop.verl:export_verl", options=("split", "query")),
)}
