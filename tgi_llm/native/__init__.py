"""The C kernels (sources in tgi_llm/csrc): built for this CPU, cached, loaded and bound in one place.

- build.py: compile the sources into one shared library, once per machine (cached, locked, warning-free);
- abi.py: the structs, enums and function signatures shared with the C side, checked when it loads;
- loader.py: the library, loaded once per process, and the registry of kernel families made from it, each
  checked against the torch reference before it serves (the torch path serves otherwise).
"""

from tgi_llm.native.build import NativeBuildError
from tgi_llm.native.loader import CheckedKernels, library, library_path

__all__ = ["CheckedKernels", "NativeBuildError", "library", "library_path"]
