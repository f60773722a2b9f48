"""``python -m pawfn.llamacpp cmake-args | check``: llama-cpp-python's build flags for this CPU, and its build's check."""

import sys

from .cpu import main

sys.exit(main())
