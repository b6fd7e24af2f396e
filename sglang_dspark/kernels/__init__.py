"""The reference engine's own CPU kernels (C++ built at first use; see cpu_rows.py)."""
