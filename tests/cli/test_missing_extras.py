"""A subcommand whose optional extra is missing (the plain wheel installs none) says
which modules are missing and the pip line, in --help and when run with any options;
exit 2, no traceback.

Found from an installed plain wheel: ``affinity serve --backend URL`` died in a
``ModuleNotFoundError`` traceback, ``affinity check-router --preset affinity`` and
``affinity verify --scope small`` failed with "unrecognized arguments" (the options of a
subcommand that could not be imported were never registered), and ``affinity verify
--help`` listed no options without saying why.
"""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec

import pytest

from affinity_cli.main import EXTRAS

from .clirun import run


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend aiohttp, z3 and simpy are not installed (find_spec is what main asks)."""
    real = importlib.util.find_spec
    hidden = {"aiohttp", "z3", "simpy"}

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name in hidden else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(("argv", "extra", "module"), [
    (["serve", "--backend", "http://127.0.0.1:8001"], "vllm", "aiohttp"),
    (["check-router", "--preset", "affinity", "--policy", "margin=2"], "vllm", "aiohttp"),
    (["verify", "--scope", "small", "--only", "3"], "proofs", "z3"),
    (["simulate", "--preset", "smoke"], "sim", "simpy"),
])
@pytest.mark.usefixtures("without")
def test_missing_extra_is_explained_whatever_the_options(argv: list[str], extra: str,
                                                         module: str) -> None:
    code, out, err = run(*argv)
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip() == (f"affinity {argv[0]}: unavailable: needs {module}: "
                           f"pip install 'affinity-routing[{extra}]'"), err
    code, out, _ = run(argv[0], "--help")
    assert code == 0 and f"pip install 'affinity-routing[{extra}]'" in " ".join(out.split())


@pytest.mark.usefixtures("without")
def test_a_typo_is_still_a_usage_error_for_an_available_command() -> None:
    code, _, err = run("replay", "log.ndjson", "--no-such-option")
    assert code == 2 and "unrecognized arguments: --no-such-option" in err


def test_every_extra_names_modules_of_that_extra() -> None:
    # The pip line must name a real extra of the distribution.
    from importlib.metadata import metadata

    provided = set(metadata("affinity-routing").get_all("Provides-Extra") or [])
    assert {extra for extra, _ in EXTRAS.values()} <= provided, provided
    for _, modules in EXTRAS.values():  # here, in the dev venv, every extra is installed
        assert all(importlib.util.find_spec(m) is not None for m in modules), modules
