"""PostgresStore: one queue shared by many processes and machines on one PostgreSQL database."""

from .store import PostgresStore

__all__ = ["PostgresStore"]
