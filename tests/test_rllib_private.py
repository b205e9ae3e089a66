"""The private RLlib / torch names rllib_ext uses: all listed in one module, all still there.

A Ray or torch release that drops or renames one fails ``test_every_listed_name_exists`` with the
name's line; the fake-module tests show the check does fail; the source scans keep new private
accesses from bypassing :mod:`rllib_ext._rllib_private`.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
import types
from pathlib import Path

import pytest

import rllib_ext
from rllib_ext._rllib_private import PRIVATE_NAMES, PrivateName, missing_private_names

PACKAGE = Path(rllib_ext.__file__).parent


def test_every_listed_name_exists_in_the_installed_ray_and_torch() -> None:
    assert missing_private_names() == []


def _fake_importer(module: types.ModuleType):
    def import_module(name: str) -> types.ModuleType:
        if name == module.__name__:
            return module
        return importlib.import_module(name)

    return import_module


@pytest.fixture
def fake_ray() -> types.ModuleType:
    """A stand-in for an RLlib module of a future release: some names gone, some kept."""
    source = """
class Runner:
    def __init__(self):
        self._kept_attribute = 1
        self._annotated: dict[
            str, int
        ] = {}

    def _kept_method(self):
        return None


class Episode:
    def get_state(self):
        return {"_kept_key": 1}


class Piece:
    def __call__(self, shared_data):
        shared_data["_kept_flag"] = True


def _kept_function():
    return None
"""
    module = types.ModuleType("fake_ray_release")
    module.__file__ = "<fake_ray_release>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    # inspect.getsource reads the class's module source through linecache.
    import linecache

    linecache.cache[module.__file__] = (len(source), None, source.splitlines(True), module.__file__)
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


@pytest.mark.parametrize(
    ("owner", "name", "kind"),
    [
        ("fake_ray_release:Runner", "_kept_attribute", "attribute"),
        ("fake_ray_release:Runner", "_annotated", "attribute"),
        ("fake_ray_release:Runner", "_kept_method", "method"),
        ("fake_ray_release", "_kept_function", "function"),
        ("fake_ray_release:Episode", "_kept_key", "state_key"),
        ("fake_ray_release:Piece", "_kept_flag", "data_key"),
    ],
)
def test_a_present_name_of_each_kind_passes(fake_ray, owner, name, kind) -> None:
    entry = PrivateName(owner, name, kind, "a test")
    assert missing_private_names([entry], import_module=_fake_importer(fake_ray)) == []


@pytest.mark.parametrize(
    ("owner", "name", "kind"),
    [
        ("fake_ray_release:Runner", "_needs_initial_reset", "attribute"),
        ("fake_ray_release:Runner", "_kept_attribute", "method"),
        ("fake_ray_release:Runner", "_log_env_steps", "method"),
        ("fake_ray_release", "_is_avx512_bf16_supported", "function"),
        ("fake_ray_release:Episode", "_hanging_rewards_end", "state_key"),
        ("fake_ray_release:Piece", "_added_loss_mask_for_valid_episode_ts", "data_key"),
    ],
)
def test_a_missing_name_fails_at_one_named_line(fake_ray, owner, name, kind) -> None:
    entry = PrivateName(owner, name, kind, "rllib_ext/some_module.py")
    lines = missing_private_names([entry], import_module=_fake_importer(fake_ray))
    assert lines == [f"{owner} has no {kind} {name} (used by rllib_ext/some_module.py)"]


def test_a_missing_owner_is_reported_not_raised(fake_ray) -> None:
    entry = PrivateName("fake_ray_release:GoneClass", "_x", "attribute", "y")
    (line,) = missing_private_names([entry], import_module=_fake_importer(fake_ray))
    assert line.startswith("fake_ray_release:GoneClass not found")


def test_the_real_list_fails_when_a_listed_owner_loses_a_name(fake_ray) -> None:
    """The shipped list pointed at a fake MultiAgentEnvRunner module: every runner name fails."""
    runner_entries = [e for e in PRIVATE_NAMES if e.owner.endswith(":MultiAgentEnvRunner")]
    assert runner_entries
    fake_module = types.ModuleType("ray.rllib.env.multi_agent_env_runner")
    fake_module.MultiAgentEnvRunner = fake_ray.Runner

    def import_module(name: str) -> types.ModuleType:
        return fake_module if name == fake_module.__name__ else importlib.import_module(name)

    lines = missing_private_names(runner_entries, import_module=import_module)
    assert len(lines) == len(runner_entries)
    assert all(":MultiAgentEnvRunner has no attribute _" in line for line in lines)


def _package_modules() -> list[types.ModuleType]:
    modules = []
    for info in pkgutil.walk_packages(rllib_ext.__path__, "rllib_ext."):
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError:  # an optional backend (StarCraft II) that is not installed
            continue
    return modules


def test_no_subclass_touches_a_private_name_of_its_ray_or_torch_base() -> None:
    """``self._x`` in an rllib_ext class, where a Ray / torch base defines ``_x``, bypasses the
    module: such reads and writes must go through :mod:`rllib_ext._rllib_private`."""
    offenders = []
    for module in _package_modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            bases = [b for b in cls.__mro__[1:] if b.__module__.startswith(("ray.", "torch."))]
            if not bases:
                continue
            own = set(re.findall(r"self\.(_[a-z]\w*)", inspect.getsource(cls)))
            for base in bases:
                try:
                    base_source = inspect.getsource(base)
                except (OSError, TypeError):
                    continue
                for name in sorted(own):
                    if re.search(rf"(self\.|def ){name}\b", base_source):
                        offenders.append(f"{cls.__module__}.{cls.__qualname__}: {name}")
    assert offenders == []


def test_private_ray_and_torch_names_are_spelled_only_in_the_module() -> None:
    pattern = re.compile(r"_global_registry|torch\.\w+\._\w|\._rl_modules|\._learner_connector")
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("_rllib_private.py", "_private_names.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
