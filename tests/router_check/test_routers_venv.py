"""Where check-router keeps the Rust routers' venv.

From a wheel the package lives in site-packages, so a default next to the package put a
220 MB venv there; the default is now a per-user cache folder outside a checkout. A
relative ``--routers-venv`` was installed relative to the current directory and then
looked up relative to the router's working directory (another one), so the router "did
not exist" right after its install; every venv path is now absolute before use.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from affinity_cli.main import build_parser
from affinity_conformance.router_check.presets import (
    PRESETS,
    default_routers_venv,
    ensure_routers_venv,
    expand,
)


def test_the_default_is_the_checkout_venv_only_in_a_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text("[project]\n", encoding="utf-8")
    assert default_routers_venv(checkout) == checkout / ".venv-routers"
    site_packages = tmp_path / "lib" / "python3.11" / "site-packages"
    site_packages.mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_routers_venv(site_packages) == \
        tmp_path / "cache" / "affinity-routing" / "venv-routers"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    from_wheel = default_routers_venv(site_packages)
    assert from_wheel == tmp_path / "home" / ".cache" / "affinity-routing" / "venv-routers"
    assert site_packages not in from_wheel.parents


def test_a_relative_routers_venv_is_made_absolute_where_it_was_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = build_parser(["check-router"]).parse_args(
        ["check-router", "--preset", "vllm-router:sticky_least_loaded",
         "--routers-venv", "rv"])
    assert args.routers_venv == tmp_path / "rv"
    assert args.routers_venv.is_absolute()
    # The router's command names the venv absolutely, whatever the caller passes on.
    command = expand(PRESETS["vllm-router:sticky_least_loaded"].template, port=1,
                     metrics_port=2, backends=["http://127.0.0.1:3"], routers=Path("rv"),
                     margin=None)
    assert command[0] == str(tmp_path / "rv" / "bin" / "vllm-router")


def test_install_uses_the_absolute_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], check: bool) -> None:
        calls.append([str(c) for c in cmd])
        (tmp_path / "rv").mkdir(exist_ok=True)  # what `python -m venv` would create

    monkeypatch.setattr("subprocess.run", fake_run)
    venv = ensure_routers_venv(Path("rv"))
    assert venv == tmp_path / "rv"
    assert calls[0][-1] == str(tmp_path / "rv")  # python -m venv <absolute>
    assert calls[1][0] == str(tmp_path / "rv" / "bin" / "pip")
    assert (tmp_path / "rv" / ".affinity-routers").is_file()
