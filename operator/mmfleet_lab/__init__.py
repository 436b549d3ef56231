"""What proves the operator: the digital twin, the benchmarks, the local control plane and the demo.

Installed with the ``lab`` extra. It may import ``mmfleet``; ``mmfleet`` never imports it.
"""
