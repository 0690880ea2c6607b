"""Stand-ins that let SGLang 0.5.17 import on a CPU machine without torchvision (PyPI's builds are CUDA-only).

SGLang's utils and transformers import torchvision at module level; the tests
never use it. ``install()`` serves every ``torchvision.*`` module as an empty
stand-in whose attributes are further stand-ins (calling one returns None).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types


class _StandIn(types.ModuleType):
    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []
        self.__version__ = "0.0.0"  # transformers parses it
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return None


class _TorchvisionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StandIn(spec.name)

    def exec_module(self, module):
        pass


def install() -> None:
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.insert(0, _TorchvisionFinder())
