#!/usr/bin/env python3
"""run.py MODULE — runs one of the package's test modules for ctest.

test_replay needs only the Python standard library and libmlo; test_torch
and test_torch_weights need torch, diffusers, transformers and peft, and
exit 77 (ctest: skipped) with the reason when they are not installed
(`make test` installs them: scripts/torch-venv.sh; MLO_TORCH=0 skips
that).  MLO_LIBRARY names the libmlo to load.
"""
import importlib.util
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    name = sys.argv[1]
    if name.startswith("test_torch"):
        missing = [m for m in ("torch", "diffusers", "transformers", "peft")
                   if importlib.util.find_spec(m) is None]
        if missing:
            print("skipped: %s not installed for %s (python/tests/record.py's recorded runs are "
                  "checked by test_replay instead)" % (", ".join(missing), sys.executable))
            return 77
    suite = unittest.defaultTestLoader.loadTestsFromName(name)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
