"""The model: the radiance field (``field``) and its encodings (``encoding``: hash grid with its torch,
Triton, C++ and tiny-cuda-nn backends; spherical harmonics).

Knows no rays, scenes, ranks or training (an import-linter contract in setup.cfg holds that)."""
