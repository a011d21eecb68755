"""Test machinery shared by the suite's directories: the fuzz state machine
(`fuzz`, `fuzz_machine`) and the shadow of block contents (`shadow`).

`tests/` is on `sys.path` while pytest runs (its conftest lives there), so
tests import these as `support.fuzz`; `benchmarks/soak.py` adds it itself.
"""
