"""VL-BERT in transformers' Auto classes: after `import vlbert`, `AutoConfig.from_pretrained(folder)` builds a
`VLBertTransformersConfig` and `AutoModel.from_pretrained(folder)` a `VLBertModel` (AUTO_MODELS: the
task models of the other Auto classes) from a model folder or a Hub id.

`import vlbert` loads neither torch nor transformers (every package imports vlbert.utils.errors), so the classes
are registered when transformers loads its Auto modules: at once where it has, else from an import hook
that waits for them. Importing vlbert.modeling registers them too (transformers' BERT, which it builds on,
loads the Auto modules first, while the model classes are not yet defined).
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import Callable

# transformers' Auto class → the VL-BERT model class it loads.
AUTO_MODELS = {
    "AutoModel": "VLBertModel",
    "AutoModelForPreTraining": "VLBertForPreTraining",
    "AutoModelForVisualQuestionAnswering": "VLBertForQuestionAnswering",
    "AutoModelForSequenceClassification": "VLBertForSequenceClassification",
    "AutoModelForMultipleChoice": "VLBertForMultipleChoice",
}
CONFIG_MODULE = "transformers.models.auto.configuration_auto"
MODELS_MODULE = "transformers.models.auto.modeling_auto"
MODELING = "vlbert.modeling"


def register_config() -> None:
    """AutoConfig knows the model type "vlbert"."""
    from transformers.models.auto.configuration_auto import AutoConfig

    from vlbert.transformers_config import MODEL_TYPE, VLBertTransformersConfig

    AutoConfig.register(MODEL_TYPE, VLBertTransformersConfig, exist_ok=True)


def register_models() -> None:
    """The Auto model classes load VL-BERT's models (vlbert.modeling calls this once its classes exist)."""
    from transformers.models.auto import modeling_auto

    from vlbert.transformers_config import VLBertTransformersConfig

    modeling = sys.modules[MODELING]
    for auto_class, model_class in AUTO_MODELS.items():
        getattr(modeling_auto, auto_class).register(VLBertTransformersConfig, getattr(modeling, model_class),
                                                    exist_ok=True)


def _models_when_transformers_has_them() -> None:
    """The model classes, from vlbert.modeling, which registers them as it ends; when it is being imported
    (its transformers imports brought the Auto modules here), it will."""
    if MODELING not in sys.modules:
        importlib.import_module(MODELING)


AFTER_IMPORT: dict[str, Callable[[], None]] = {CONFIG_MODULE: register_config,
                                               MODELS_MODULE: _models_when_transformers_has_them}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a function once its module has loaded (the module's own finder finds it), then forgets it. It
    stays in sys.meta_path, finding nothing: the import system may be going through that list."""

    def __init__(self, waiting: dict[str, Callable[[], None]]) -> None:
        self.waiting = waiting

    def find_spec(self, name, path, target=None):
        if name not in self.waiting:
            return None
        then = self.waiting.pop(name)
        spec = next((spec for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec")
                     for spec in [finder.find_spec(name, path, target)] if spec is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # nothing to wait for: the import fails, or loads in a way this cannot follow
        load = spec.loader.exec_module

        def exec_module(module) -> None:
            load(module)
            then()

        spec.loader.exec_module = exec_module  # this module's loader only: each source file has its own
        return spec


def register_when_transformers_loads() -> None:
    """Registers VL-BERT with transformers' Auto classes now where transformers has loaded them, else as
    it loads them."""
    waiting = {}
    for module, then in AFTER_IMPORT.items():
        if module in sys.modules:
            then()
        else:
            waiting[module] = then
    if waiting and not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(waiting))
