"""The knobs of synthesis, in one documented object: flows take it as their parameter, so the Prefect UI
renders the same documentation as a form."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from generators.llm import EMBEDDED, Budget, EndpointConfig, Sampling
from generators.sampling import SamplingConfig
from generators.sources import (
    SOURCE_KINDS,
    EnvironmentSource,  # noqa: F401 - where configs and tests name it
    content_hash,
)
from generators.strict import RUN_NAME_HELP, RunName, StrictModel
from storage.identity import code_digest, run_identity

CORPUS_CODE = ("envs", "generators", "verifiers", "sandbox")
"""The packages whose source shapes every corpus row (environments, sampling, agents, verifiers, the sandbox)."""


def code_version() -> str:
    """Hash of the source of every package that shapes a corpus (recorded in each manifest)."""
    return code_digest(CORPUS_CODE)


WEAKNESSES = ("wrong_tool", "wrong_argument", "missing_step", "premature_answer", "wrong_answer", "format_error",
              "looping", "gave_up", "constraint_violation", "none")
Weakness = Literal["wrong_tool", "wrong_argument", "missing_step", "premature_answer", "wrong_answer", "format_error",
                   "looping", "gave_up", "constraint_violation", "none"]
Topology = Literal["single", "chain", "fork", "merge", "dag", "parallel"]


class VariantSeed(StrictModel):
    """A parent task of the closed loop and what its variants should drill (see ``generators.variants``).

    Variants are new tasks on the parent's domain, sampled on a fresh environment (other values) with the
    parent's structural signature (topology, depth, tool set), biased towards the diagnosed weakness.
    JSON-serialisable, so a Prefect flow parameter carries a list of them.
    """

    parent_run_id: str = Field(description="Run of the parent task.")
    parent_task_id: str = Field(description="The parent task's id within its run.")
    domain: str = Field(description="The parent's domain; variants are sampled there.")
    topology: Topology = Field(description="The parent's signature topology.")
    depth: int = Field(ge=1, le=6, description="The parent's depth (calls on the longest dependency path).")
    width: int = Field(1, ge=1, le=6, description="The parent's width (most calls at one dependency level).")
    n_calls: int = Field(1, ge=1, description="The parent's number of calls.")
    tools: list[str] = Field(min_length=1, description="The parent's tool set.")
    weakness: Weakness = Field("none", description="The failure label the variants are biased towards.")
    n: int = Field(1, ge=1, le=1000, description="Variants wanted from this parent.")
    parent_round: int = Field(0, ge=0, description="The parent's lineage round; variants get round + 1.")
    parent_env_seed: int | None = Field(None, description="The parent's environment seed; variants avoid it.")

    @property
    def parent_id(self) -> str:
        """The parent's corpus-wide id, as variants store it in ``lineage.parent_id``."""
        return f"{self.parent_run_id}/{self.parent_task_id}"

    @model_validator(mode="after")
    def _known_tools(self) -> VariantSeed:
        from envs import DOMAINS

        if self.domain not in DOMAINS:
            raise ValueError(f"variant seed of {self.parent_id}: unknown domain {self.domain!r}; "
                             f"built-in domains: {sorted(DOMAINS)}")
        unknown = sorted(set(self.tools) - set(DOMAINS[self.domain].tools()))
        if unknown:
            raise ValueError(f"variant seed of {self.parent_id}: tools {unknown} are not tools of domain "
                             f"{self.domain!r}; take the tool set from the parent's signature")
        return self


SourceConfig = Annotated[
    Union[tuple(Annotated[SOURCE_KINDS[k].config, Tag(k)] for k in sorted(SOURCE_KINDS))],  # noqa: UP007 - made from a tuple
    Discriminator(lambda v: v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None),
                  custom_error_type="source_kind",
                  custom_error_message=f"kind must be one of {', '.join(sorted(SOURCE_KINDS))} (what ref is)")]
"""One entry of ``SynthesizeConfig.environments``: the config model of its kind (``generators.sources``), told
apart by ``kind``."""
DEFAULT_DOMAINS = ("retail", "calendar", "banking", "files")
"""The built-in domains a run samples when it names no domain and brings no environment of its own."""


class RoleConfig(StrictModel):
    """Who plays one role, on which endpoint, with which sampling parameters."""

    agent: Literal["scripted", "llm"] = Field("llm", description="'scripted' (deterministic, no model) or 'llm'.")
    endpoint: str = Field(EMBEDDED, description="Name of an entry in `endpoints`.")
    sampling: Sampling = Field(default_factory=Sampling)


class AgentsConfig(StrictModel):
    """The LLM side of a run: which agents play which role, on which endpoints, within which budget.

    Every task gets a scripted reference rollout and negative controls (that is how its verifier is proven);
    ``llm_tasks`` of them, spread evenly over the run, are also rolled out by the configured agents: the task
    writer rewrites their requests first, then the assistant (teacher) tries, and on a failed verification
    tries again with a hint. Failed attempts are kept as negatives with their verdicts.
    """

    llm_tasks: int = Field(4, ge=0, description="Tasks that also get LLM rollouts (0 = scripted agents only, no model).")
    assistant: RoleConfig = Field(default_factory=lambda: RoleConfig(sampling=Sampling(temperature=0.2, max_tokens=256)))
    user: RoleConfig = Field(default_factory=lambda: RoleConfig(sampling=Sampling(temperature=0.7, max_tokens=96)))
    task_writer: RoleConfig = Field(default_factory=lambda: RoleConfig(sampling=Sampling(temperature=0.8, max_tokens=160)))
    hints: list[Literal["plan", "feedback"]] = Field(
        default_factory=lambda: ["plan"],
        description="Retries after a failed attempt, in order: 'plan' shows the reference path (private values "
        "masked), 'feedback' the failed verifier checks. [] = one attempt per task.")
    max_calls: int = Field(2, ge=1, le=50, description="Only tasks whose reference plan has at most this many calls "
                           "get LLM rollouts (a 0.5B model rarely solves longer ones).")
    max_turns: int = Field(6, ge=2, le=40, description="Assistant turns per LLM conversation.")
    concurrency: int = Field(4, ge=1, le=512, description="LLM conversations in flight at once per batch.")
    endpoints: dict[str, EndpointConfig] = Field(
        default_factory=lambda: {EMBEDDED: EndpointConfig()},
        description="Named OpenAI-compatible endpoints; one without base_url is the embedded local model.")
    budget: Budget = Field(default_factory=Budget)

    @model_validator(mode="after")
    def _known_endpoints(self) -> AgentsConfig:
        for role in ("assistant", "user", "task_writer"):
            cfg: RoleConfig = getattr(self, role)
            if cfg.agent == "llm" and cfg.endpoint not in self.endpoints:
                raise ValueError(f"agents.{role}.endpoint {cfg.endpoint!r} is not in agents.endpoints "
                                 f"({sorted(self.endpoints)}); add it there or pick one of those")
        return self

    def roles(self) -> dict[str, RoleConfig]:
        return {r: getattr(self, r) for r in ("assistant", "user", "task_writer") if getattr(self, r).agent == "llm"}

    def needs_embedded(self) -> bool:
        return self.llm_tasks > 0 and any(self.endpoints[r.endpoint].base_url is None for r in self.roles().values())


class SynthesizeConfig(StrictModel):
    """One synthesis run: which domains, how many tasks, how they are sampled, where the corpus goes."""

    CODE_SCOPE: ClassVar[tuple[str, ...]] = (*CORPUS_CODE, "stages/synthesize.py", "stages/rollouts.py")

    run_name: RunName = Field("default", description="Name of the run; with the config's hash it forms the "
                              f"run id. {RUN_NAME_HELP}")
    seed: int = Field(0, description="Master seed; the same config always produces the same corpus.")
    domains: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DOMAINS),
        description="Built-in environment domains to sample tasks from. Default: retail, calendar, banking and "
        "files, or none when environments are given (name them here to sample both).",
    )
    environments: list[SourceConfig] = Field(
        default_factory=list,
        description="The user's own tools (OpenAPI catalogs, MCP servers, Python domains, Python objects); with domains also "
        "listed, tasks are spread over every domain and source in turn.")
    n_tasks: int = Field(1400, ge=1, description="Tasks to sample; those whose verifier fails its controls are kept but not accepted.")
    batch_size: int = Field(200, ge=1, le=2000, description="Tasks per batch: one Prefect task run, one Parquet shard per table.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    code_check_share: float = Field(
        0.03, ge=0, le=1, description="Share of tasks that also carry a verifier check expressed as code (run sandboxed)."
    )
    agents: AgentsConfig = Field(default_factory=AgentsConfig)
    variants: list[VariantSeed] = Field(
        default_factory=list,
        description="Closed loop: parents to make variants of. When given, the run's tasks are these variants "
        "(n_tasks = the sum of their n, in seed order) instead of freshly sampled tasks; [] = a normal run.",
    )

    @field_validator("domains")
    @classmethod
    def _known_domains(cls, domains: list[str]) -> list[str]:
        from envs import DOMAINS

        unknown = [d for d in domains if d not in DOMAINS]
        if unknown:
            raise ValueError(f"unknown domain(s) {unknown}; built-in domains: {sorted(DOMAINS)}")
        if len(set(domains)) != len(domains):
            raise ValueError(f"domains listed twice in {domains}")
        return domains

    @model_validator(mode="after")
    def _own_tools_only(self) -> SynthesizeConfig:
        # a user who brings their own tools and names no domain wants tasks on those tools, not on the demos
        if self.environments and "domains" not in self.model_fields_set:
            self.domains = []
        return self

    @model_validator(mode="after")
    def _some_environment(self) -> SynthesizeConfig:
        if not self.domains and not self.environments:
            raise ValueError("no environment to sample from: list built-in domains, environments (a catalog, an "
                             "MCP server, a Python domain), or both")
        return self

    @model_validator(mode="after")
    def _variant_tasks(self) -> SynthesizeConfig:
        if not self.variants:
            return self
        missing = sorted({s.domain for s in self.variants} - set(self.domains))
        if missing:
            raise ValueError(f"variants: seeds on domain(s) {missing} not in domains {self.domains}; add them "
                             f"to domains")
        total = sum(s.n for s in self.variants)
        if "n_tasks" in self.model_fields_set and self.n_tasks != total:
            raise ValueError(f"n_tasks ({self.n_tasks}) must equal the variants wanted (sum of variants[].n = "
                             f"{total}); leave n_tasks out of a variant run")
        self.n_tasks = total
        return self

    def llm_quota(self, batch: int) -> int:
        """How many of the batch's tasks get LLM rollouts: ``agents.llm_tasks`` spread evenly over the batches."""
        k = self.agents.llm_tasks if self.agents.roles() else 0
        return k * (batch + 1) // self.n_batches - k * batch // self.n_batches

    @property
    def n_batches(self) -> int:
        return -(-self.n_tasks // self.batch_size)

    def asked(self) -> dict:
        """Everything besides the code that changes the output. A user's source counts by content (the catalog's
        files, the plugin's source, the MCP state folder), so editing a spec makes a new run even though its path
        is the same."""
        sources = {f"{s.kind}:{s.ref}": content_hash(s) for s in self.environments}
        return {"config": self.model_dump(mode="json"), **({"sources": sources} if sources else {})}

    @property
    def run_id(self) -> str:
        """A re-run of the same config resumes; one after a change to the code in ``CODE_SCOPE`` starts a new run
        instead of mixing old and new batches."""
        return self.identity()[0]

    def identity(self) -> tuple[str, dict[str, str]]:
        """The run id and the content hash of each user source (``"<kind>:<ref>"``) it was made from, read once."""
        asked = self.asked()
        return run_identity(self.run_name, asked, self.CODE_SCOPE), dict(asked.get("sources", {}))
