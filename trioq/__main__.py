"""``python -m trioq``: the ``trioq`` command."""

from ._app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
