"""The malformed-submission corpus (see ``cases.py``), run by ``tests/test_malformed_corpus.py``."""
