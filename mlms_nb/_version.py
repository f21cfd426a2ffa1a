"""The version of mlms-nb, in one place (the package, the stack description and OTel exports read it)."""
__version__ = "0.1.0"
