"""Register the plugin's fairseq components whenever fairseq is imported, and only then.

The gated transformer and the L0 criterion of Voita et al. 2019 ("Analyzing Multi-Head
Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019)
are fairseq components: importing their modules imports all of fairseq (several seconds).
The tools that only read checkpoints, masks and records (``fairseq-headprune gates``,
``flags``, ``export``, the study's record and report helpers) need none of it.

So the package registers lazily, and still in every order of imports:

- fairseq already imported (a fairseq CLI loading ``--user-dir fairseq_headprune``, or a
  script that imported fairseq first): the components are registered at once;
- otherwise an import hook registers them as soon as ``import fairseq`` has finished and no
  module of this package is half-imported (one of them may be what imports fairseq; the
  components import it in turn, so they wait until it is complete). This matters because
  fairseq's ``import_user_module`` skips a package that is already in ``sys.modules``: a
  script that imported a light module of this package and then runs a fairseq CLI
  in-process still finds ``--arch gated_transformer`` and the criterion.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from types import ModuleType

PACKAGE = __name__.rpartition(".")[0]
# Modules whose import registers a fairseq component (``register_model``, …).
FAIRSEQ_COMPONENTS = (f"{PACKAGE}.gated_transformer", f"{PACKAGE}.l0_criterion")


def register() -> None:
    """Import the component modules (fairseq's registries ignore a module imported twice)."""
    from fairseq_headprune.checkpoint_safety import allow_fairseq_checkpoints

    for name in FAIRSEQ_COMPONENTS:
        importlib.import_module(name)
    allow_fairseq_checkpoints()  # now with fairseq's distributed placeholder


class _Tracked(importlib.abc.Loader):
    """A module's own loader, telling the hook when the module starts and ends executing."""

    def __init__(self, loader: importlib.abc.Loader, hook: _RegisterAfterFairseq) -> None:
        self._loader, self._hook = loader, hook

    def create_module(self, spec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._hook.executing += 1
        try:
            self._loader.exec_module(module)
        finally:
            self._hook.executing -= 1
        self._hook.register_when_ready()

    def __getattr__(self, name: str):  # get_source, get_filename, … of the real loader
        if name.startswith("_"):  # not found on this object (e.g. before __init__ ran)
            raise AttributeError(name)
        return getattr(self._loader, name)


class _RegisterAfterFairseq(importlib.abc.MetaPathFinder):
    """Watches the imports of fairseq and of this package's modules until it has registered."""

    def __init__(self) -> None:
        self.executing = 0  # watched modules executing now (nested imports)

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != "fairseq" and not fullname.startswith(f"{PACKAGE}."):
            return None
        for finder in sys.meta_path:  # whichever finder has it (site-packages, editable, …)
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Tracked(spec.loader, self)
                return spec
        return None

    def register_when_ready(self) -> None:
        if self.executing or "fairseq" not in sys.modules or self not in sys.meta_path:
            return
        sys.meta_path.remove(self)
        register()


def register_with_fairseq() -> None:
    """Register now if fairseq is imported, else as soon as it is."""
    if "fairseq" in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterAfterFairseq) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterFairseq())
