"""The knobs of a training run, in one documented object (the ``train`` flow's parameter and the Prefect UI form).

No Prefect import here: the CLI builds the config before it sets the Prefect API URL."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from generators.strict import RUN_NAME_HELP, RunName, StrictModel
from storage.identity import run_identity
from training.bfcl_eval import BfclSettings
from training.evaluate import MaxDepth
from training.grpo import GRPOSettings
from training.sft import SFTSettings


class EvalSettings(StrictModel):
    """How a policy is evaluated on the held-out tasks."""

    tasks: int = Field(20, ge=1, description="Held-out tasks evaluated (the first ones of the stratified held-out set).")
    k: int = Field(1, ge=1, le=16, description="Attempts per task (pass^k needs k > 1; sampled at temperature 0.7).")
    max_turns: int = Field(8, ge=1, le=40, description="Assistant turns before the episode is cut.")
    max_new_tokens: int = Field(160, ge=16, le=2048)
    max_depth: MaxDepth = Field(2, description="Only held-out tasks this deep or shallower: the CPU "
                                                             "default's 135M policy solves none deeper; null = all.")


class TrainConfig(StrictModel):
    """One training run: which stages, on which corpus split, evaluated how."""

    CODE_SCOPE: ClassVar[tuple[str, ...]] = ("training", "stages/train.py")

    run_name: RunName = Field("train", description=f"Name of the run; with the config's hash it forms the run id. "
                                                  f"{RUN_NAME_HELP}")
    sft: SFTSettings | None = Field(default_factory=SFTSettings, description="SFT stage settings; null = skip SFT.")
    grpo: GRPOSettings | None = Field(default_factory=GRPOSettings, description="GRPO stage settings (after SFT "
                                                                                "when both run); null = skip GRPO.")
    evaluation: EvalSettings = Field(default_factory=EvalSettings)
    bfcl: BfclSettings | None = Field(None, description="BFCL accuracy of each evaluated policy (rows of "
                                                        "bfcl_evals beside policy_evals); null = none.")

    @model_validator(mode="after")
    def _stages(self) -> TrainConfig:
        if self.sft and self.grpo and self.grpo.held_out_share != self.sft.held_out_share:
            raise ValueError("grpo.held_out_share must equal sft.held_out_share: the held-out tasks are shared")
        return self

    def run_id(self) -> str:
        """Hash of the config and of the training code (a new chat template must not resume an old run)."""
        return run_identity(self.run_name, {"config": self.model_dump(mode="json")}, self.CODE_SCOPE)
