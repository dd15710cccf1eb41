"""Model families, one folder each: ``<name>/__init__.py`` declares the family's spec (``SPEC``, torch-free), its
other modules hold the Hugging Face mapping (``bridge.py``) and its recipes. A family is registered by one line in
``config/families.py``'s ``FAMILY_PACKAGES``; the lower floors reach it only through that registry
(docs/models/adding-a-family.md)."""
