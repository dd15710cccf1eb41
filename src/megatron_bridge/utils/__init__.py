"""Small shared helpers (rank-aware logging, distributed queries that work before init)."""
