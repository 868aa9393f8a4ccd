"""Ray actors: engine replicas, the batching coordinator, the Ray Data sampling stage.

They drive `presto_ray.chain.Chain` and hold no sampling logic of their own: every random choice
is keyed inside the chain, so which actor, replica or batch serves a request never changes a sample.
"""
