"""rlmix: asynchronous RL with a heterogeneous sampler fleet and explicit off-policy correction."""

__version__ = "0.1.0"
