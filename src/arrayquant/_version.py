"""The package version, in the one place ``pyproject.toml`` reads it from and every module imports it from."""

__version__ = "0.1.0"  #: The package version (PEP 440); pyproject.toml reads it from here

__all__ = ["__version__"]
