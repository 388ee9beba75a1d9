"""From a validated ``RunConfig`` to the objects a run needs (``fleet``: samplers; ``parts``: the rest)."""
