"""The public surface: everything public is importable from the top and listed in __all__."""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
import pkgutil

import nous_session


def test_all_is_sorted_and_importable() -> None:
    assert list(nous_session.__all__) == sorted(nous_session.__all__)
    for name in nous_session.__all__:
        assert hasattr(nous_session, name), name


def test_every_public_name_of_every_module_is_exported() -> None:
    exported = set(nous_session.__all__)
    for module_info in pkgutil.walk_packages(nous_session.__path__, "nous_session."):
        name = module_info.name
        if any(part.startswith("_") for part in name.split(".")[1:]):
            continue
        if (
            name.endswith(("__main__", ".cli", ".demo"))
            or ".stores." in name
            or ".integrations." in name
            or name == "nous_session.web"
            or name == "nous_session.testing"
        ):
            continue  # entry points, optional backends and extras, adapters, the test kit
        module = importlib.import_module(name)
        missing = {
            item
            for item in getattr(module, "__all__", ())
            if item not in exported
            and getattr(nous_session, item, None) is not getattr(module, item)
        }
        # Module-level helpers may stay in their module; classes and errors must be exported.
        missing = {item for item in missing if isinstance(getattr(module, item), type)}
        assert not missing, f"{name} has public classes missing from nous_session: {missing}"


def test_py_typed_is_shipped() -> None:
    assert importlib.resources.files("nous_session").joinpath("py.typed").is_file()


def test_the_store_contract_lists_every_class_and_check_it_defines() -> None:
    """A third-party store is written against :mod:`nous_session.stores.base`: every protocol,
    value and ``check_*`` helper it defines is in its ``__all__`` (``LeasingStore`` and
    ``check_lease`` were not)."""
    from nous_session.stores import base

    defined = {
        name
        for name, value in vars(base).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == base.__name__
    }
    assert defined - set(base.__all__) == set()
