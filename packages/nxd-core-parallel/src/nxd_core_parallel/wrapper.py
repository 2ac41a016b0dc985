"""The attribute rule of nxd's model wrappers (``NxDModel``, ``NxDPPModel``, ``LoRAModel``): what a
wrapper lacks is its wrapped model's, as NxD's wrappers forward it (scripts call
``model.zero_padding_weights()``, read ``model.config``... through any wrapper)."""

from __future__ import annotations

from typing import Any


class ForwardsToModule:
    """Mixin, before ``nn.Module`` in the bases, for a wrapper holding its model as ``self.module``:
    an attribute the wrapper lacks is looked up on that model."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # nn.Module's: parameters, buffers, submodules
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is None or name == "module":
                raise
            return getattr(module, name)
