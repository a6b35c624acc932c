"""Build glue: setuptools reads the metadata from pyproject.toml; this file only adds the cffi extension."""

from setuptools import setup

setup(cffi_modules=["native/_ffi_build.py:ffibuilder"])
