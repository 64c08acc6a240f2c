"""Testing support (behind :mod:`trioq.testing`): fault plans, the crash-injecting log, checks."""
