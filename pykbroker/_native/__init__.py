"""Optional C extensions (built by setup.py); pure-Python fallbacks live beside their callers."""
