"""The KV cache the suite's vLLM engines reserve: a size, not vLLM's share of the NUMA node, so the
suite's memory and its engines' start-up are the same on every machine. The share (the shipped
default, 0.3) less the worker's own 1.57 GiB gave 4.6 GiB (107k tokens) on a 17.8 GiB node, whose
allocation took 5.5-6.6 s of each start (1 GiB: 0.3 s); on a 9.7 GiB node a share of 0.15 left
nothing and vLLM refused to start. 1 GiB is 23,296 tokens of SmolLM2-135M in fp32."""

KV_CACHE_GIB = 1.0
ENGINE = {"kind": "vllm", "kv_cache_gib": KV_CACHE_GIB}  # configs/local.yaml's engine otherwise
