"""The field suite: third-party programs (HF transformers in both frameworks, autocast, torchrun,
jax.distributed), each case's truth computed inside the test by the frameworks' own hooks,
independently of tracediff. Every test here carries the `field` marker; README's test command
deselects them (pyproject's addopts `-m "not field"`) and `.ci/run` runs them as their own stage:
`python -m pytest -q -m field tests/field`."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/field/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.field)
