"""Backends: the registry of array libraries and the shim that hides their differences."""

from .registry import BACKENDS, BackendInfo, available, default, get, namespace, probe

__all__ = ["BACKENDS", "BackendInfo", "available", "default", "get", "namespace", "probe"]
