"""What proves the operator: the digital twin, the benchmarks, the local control plane and the demo.

The distribution ``mmfleet-lab`` (lab/pyproject.toml), which the ``lab`` extra of ``mmfleet``
requires. It may import ``mmfleet``; ``mmfleet`` never imports it. Where this package is importable
without its dependencies (a checkout's ``operator/`` on the path), importing it checks for them
first: without them the ``mmfleet`` command leaves the lab's sub-commands out and says what to
install, instead of failing half-way through one.
"""

from importlib.util import find_spec

_NEEDS = ("numpy", "numba", "matplotlib", "cryptography")
_MISSING = [name for name in _NEEDS if find_spec(name) is None]
if _MISSING:
    raise ImportError(
        f"the lab needs {', '.join(_MISSING)}: from a checkout, pip install -e '.[lab]' -e ./lab (make install does)"
    )
