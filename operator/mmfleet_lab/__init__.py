"""What proves the operator: the digital twin, the benchmarks, the local control plane and the demo.

Installed with the ``lab`` extra. It may import ``mmfleet``; ``mmfleet`` never imports it. ``pip
install .`` puts this package on disk too (one distribution), so importing it checks for the
extra's dependencies first: without them the ``mmfleet`` command leaves the lab's sub-commands out
and says what to install, instead of failing half-way through one.
"""

from importlib.util import find_spec

_NEEDS = ("numpy", "numba", "matplotlib", "cryptography")
_MISSING = [name for name in _NEEDS if find_spec(name) is None]
if _MISSING:
    raise ImportError(f"the lab needs {', '.join(_MISSING)}: pip install 'mmfleet[lab]'")
