import os
import sys

# Test helpers (the exact-law reference) live beside the tests.
sys.path.insert(0, os.path.dirname(__file__))
