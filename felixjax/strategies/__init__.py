"""Search strategies, one file each, registered by name: ``random``, ``genetic``, ``gradient``."""
from .base import SearchContext, Strategy, get_strategy, register, registered

__all__ = ["SearchContext", "Strategy", "get_strategy", "register", "registered"]
