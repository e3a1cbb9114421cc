"""``ebbflow-py`` / ``python -m ebbflow``: the runtime's command line with Python apps.

    python -m ebbflow runtime local --app python --entry mymodel:App --clocks 100
    python -m ebbflow runtime elastic-node --app python --entry mymodel:App --coordinator ...

``runtime`` takes exactly the arguments of ``ebbflow-runtime`` (``--help`` lists them), plus
``--app python --entry module:Class [--app-args JSON]``. ``EBBFLOW_PYTHON_PATH`` adds
directories to the module path.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command != "runtime":
        print(f"ebbflow-py: unknown command {command!r} (expected: runtime)", file=sys.stderr)
        return 2
    from . import _core

    try:
        _core.main(["ebbflow runtime", *rest])
    except RuntimeError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
