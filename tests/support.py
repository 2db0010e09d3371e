"""Helpers shared by test modules."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(condition: bool, what: str, *, fix: str = "install it with .ci/install-browser") -> None:
    """Skip when something the test needs is missing, except in CI (CI=true), where that is a failure: CI must
    never pass without having looked."""
    if condition:
        return
    message = f"{what} is missing; {fix}"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)
