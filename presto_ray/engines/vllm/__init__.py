"""The vLLM engine: `config` (VLLMEngineConfig, plain pydantic), `tokenizer` (the model folder and
its tokenizer), `codec` (requests to SamplingParams, outputs to Completions: pure), `runtime`
(AsyncLLM on its event-loop thread), `engine` (VLLMEngine: batched calls) and `streaming`
(VLLMStreamingEngine: per-request streams); `sampler_patch` runs in vLLM's workers and
`sampler_columns` reads what it adds.

Importing this package does not import vLLM: that happens when an engine starts.
"""

from presto_ray.engines.vllm.config import VLLMEngineConfig
from presto_ray.engines.vllm.engine import VLLMEngine

__all__ = ["VLLMEngine", "VLLMEngineConfig"]
