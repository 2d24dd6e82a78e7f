"""The install tier (marker ``install``): the app driven from a virtualenv set up exactly as the README says
(``installer/setup.sh``, no test extra). Deselect it with ``-m "not install"``. Only test_*.py files are
collected here: drive_app.py runs under the install's own python, never imported by pytest."""

from __future__ import annotations


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "install: drives the app from a fresh README install "
                                       "(installer/setup.sh, no test extra); deselect with -m 'not install'")

