"""Vendor backends (nvidia, amd, cpu): the interface is in ``base``, loading and lookups in
``registry``; see docs/architecture.md, "## Backends"."""
