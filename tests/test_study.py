from __future__ import annotations

import json

from autotune.study import _same_search


def test_a_study_made_before_a_new_setting_existed_still_resumes() -> None:
    old = json.dumps({"model": "m", "seq_len": 64})
    assert _same_search(old, json.dumps({"model": "m", "seq_len": 64, "base_arguments": {}}))
    assert not _same_search(
        old, json.dumps({"model": "m", "seq_len": 64, "base_arguments": {"lr": 1}})
    )
    assert not _same_search(old, json.dumps({"model": "m", "seq_len": 128}))
    assert not _same_search(old, json.dumps({"model": "m"}))
