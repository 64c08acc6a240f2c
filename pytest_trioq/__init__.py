"""pytest_trioq: a pytest plugin for testing trio apps that use trioq.

Registered through the ``pytest11`` entry point. Fault injection (failures,
hangs, delays, simulated crashes) arrives with ``trioq.testing``; for now the
plugin only registers itself.
"""
