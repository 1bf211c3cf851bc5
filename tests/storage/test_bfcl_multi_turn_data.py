"""BFCL v4 multi-turn data comes from the pinned bfcl-eval wheel, fetched without dependencies and unpacked once."""

import pytest

from storage.external import (BFCL_CLASS_FILES, MULTI_TURN_CATEGORIES, bfcl_eval_root, bfcl_function_docs,
                              bfcl_multi_turn)


@pytest.fixture(scope="module")
def root():
    return bfcl_eval_root()


def test_the_wheel_unpacks_the_checker_the_classes_and_mpmath_once(root):
    package = root / "bfcl_eval"
    assert (package / "eval_checker" / "multi_turn_eval" / "multi_turn_checker.py").is_file()
    for module in BFCL_CLASS_FILES.values():
        assert (package / "eval_checker" / "multi_turn_eval" / "func_source_code" / f"{module}.py").is_file()
    assert (root / "mpmath" / "__init__.py").is_file()
    assert bfcl_eval_root() == root  # the second call reuses the folder


@pytest.mark.parametrize("category", MULTI_TURN_CATEGORIES)
def test_each_category_has_200_entries_with_their_ground_truth_per_turn(root, category):
    entries = bfcl_multi_turn(category, root)
    assert len(entries) == 200
    assert len({e["id"] for e in entries}) == 200
    for e in entries:
        assert e["id"].startswith(category)
        assert len(e["ground_truth"]) == len(e["question"])  # one list of calls per user turn
        assert set(e["involved_classes"]) <= set(BFCL_CLASS_FILES)
    if category == "multi_turn_miss_func":
        assert all(e["missed_function"] for e in entries)


def test_function_docs_and_unknown_names(root):
    docs = bfcl_function_docs("GorillaFileSystem", root)
    assert {"cd", "mkdir", "mv", "grep"} <= {d["name"] for d in docs}
    with pytest.raises(ValueError, match="known: multi_turn_base"):
        bfcl_multi_turn("multi_turn_nope", root)
    with pytest.raises(ValueError, match="GorillaFileSystem"):
        bfcl_function_docs("Nope", root)
