"""ModelSpec / LayerGraph: a model's architecture from its HF config alone (no weights).

`spec.py` holds the layer graph of dense and mixture-of-experts decoders; `moe.py` the
experts, routing and attention facts of the MoE families.
"""

from autoplan.modelspec.moe import SUPPORTED as MOE_TYPES
from autoplan.modelspec.moe import MoESpec
from autoplan.modelspec.spec import ROLES, LinearLayer, ModelSpec, part_of

__all__ = ["LinearLayer", "MOE_TYPES", "MoESpec", "ModelSpec", "ROLES", "part_of"]
