"""The serving workload a plan is optimized for."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Workload(BaseModel):
    """Concurrent sequences decoded together, and prompt/generation lengths in tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch: int = Field(1, ge=1, le=65536, description="concurrent sequences (decode batch)")
    input_len: int = Field(512, ge=1, le=1_048_576, description="prompt tokens per request")
    output_len: int = Field(128, ge=1, le=1_048_576, description="generated tokens per request")

    @property
    def mean_decode_context(self) -> float:
        """Average KV context length seen by a decode step."""
        return self.input_len + (self.output_len - 1) / 2


__all__ = ["Workload"]
