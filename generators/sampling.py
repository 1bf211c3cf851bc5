"""How tool-call plans are sampled: the sampler's knobs (``generators.tasks.PlanSampler`` reads them), below the
run's config (``generators.config.SynthesizeConfig.sampling``) so the sampler never imports the run's config."""

from __future__ import annotations

from pydantic import Field, model_validator

from generators.strict import StrictModel


class SamplingConfig(StrictModel):
    """How tool-call plans are sampled from the tool graph."""

    depth_min: int = Field(1, ge=1, le=6, description="Shortest dependency path to sample (in calls).")
    depth_max: int = Field(6, ge=1, le=6, description="Longest dependency path to sample (in calls).")
    max_width: int = Field(3, ge=1, le=6, description="Most calls at one dependency level (forks, merges, parallel calls).")
    nonlinear_share: float = Field(
        0.5, ge=0, le=1, description="Share of plans given extra branches (fork, merge or independent parallel calls)."
    )
    parallel_share: float = Field(
        0.35, ge=0, le=1, description="Share of tasks whose assistant issues independent ready calls in one turn."
    )
    private_share: float = Field(
        0.5, ge=0, le=1, description="Chance that an identifying argument is moved into the user's private information."
    )
    optional_arg_share: float = Field(0.3, ge=0, le=1, description="Chance of binding each optional argument.")
    diversity: float = Field(
        1.0, ge=0, le=5,
        description="How strongly tool choice favours tools used less so far in the batch (0 = uniform).",
    )

    @model_validator(mode="after")
    def _depths(self) -> SamplingConfig:
        if self.depth_min > self.depth_max:
            raise ValueError(f"depth_min ({self.depth_min}) must not exceed depth_max ({self.depth_max})")
        return self
