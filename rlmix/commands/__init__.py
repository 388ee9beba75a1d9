"""The entry points behind ``rlmix train|eval|probe|report``.

Each composes the typed config (``compose``), assembles the parts (``rlmix.assembly``) and calls the
library. Nothing below this package imports it.
"""
