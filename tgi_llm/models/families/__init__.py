"""The families served natively, one file each: how its config.json maps onto ModelConfig."""

from tgi_llm.models.families.gemma import GEMMA, GEMMA2, GEMMA3
from tgi_llm.models.families.granite import GRANITE
from tgi_llm.models.families.llama import LLAMA, MISTRAL, QWEN2
from tgi_llm.models.families.moe import MIXTRAL, QWEN3_MOE
from tgi_llm.models.families.olmo2 import OLMO2
from tgi_llm.models.families.phi3 import PHI3
from tgi_llm.models.families.qwen3 import QWEN3
from tgi_llm.models.families.smollm3 import SMOLLM3

FAMILIES = (LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA, GEMMA2, GEMMA3, PHI3, GRANITE, OLMO2, SMOLLM3, MIXTRAL, QWEN3_MOE)
