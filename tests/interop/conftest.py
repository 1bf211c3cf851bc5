"""A small synthesized corpus (scripted agents, no model) that the interop tests serve to outside agents."""

from __future__ import annotations

import pytest

from interop import TaskLibrary
from tests.helpers import scripted_corpus


@pytest.fixture(scope="session")
def interop_corpus(tmp_path_factory):
    return scripted_corpus(tmp_path_factory.mktemp("interop-corpus"), run_name="interop", n_tasks=40, depth_max=3)


@pytest.fixture(scope="module")
def library(interop_corpus):
    lib = TaskLibrary(interop_corpus)
    yield lib
    lib.close()
