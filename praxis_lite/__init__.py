"""praxis_lite: Fiddle-configured Flax layers in the style of Praxis."""

from praxis_lite.base_layer import BaseLayer
from praxis_lite.config import Config, Partial, instantiate, template_field
from praxis_lite.py_utils import NestedMap

__all__ = ["BaseLayer", "Config", "NestedMap", "Partial", "instantiate", "template_field"]
