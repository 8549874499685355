"""Fixtures of the drill tests: the live server's trainer environment of the SDK tests."""

from sdk.conftest import trainer_env  # noqa: F401  (a fixture, used by name)
