"""Presets for `python -m sfengine.train --cfg=<name>`, installed as the package ``sfengine_configs``."""
