"""Only the optional C extension; everything else is in pyproject.toml.

``optional=True``: without a C compiler or OpenSSL's headers the build of ``kvmesh._chain``
fails with a warning, the install goes on, and ``kvmesh.hashing`` runs its Python path (the
same bytes, slower)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("kvmesh._chain", ["kvmesh/_chain.c"], libraries=["crypto"],
                             optional=True)])
