"""filledfirst: find out what fills up first when an LLM server is pushed."""

__version__ = "0.1.0"
