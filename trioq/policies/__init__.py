"""Claim policies: which ready job may run next, beyond priority and order (limits so far)."""
