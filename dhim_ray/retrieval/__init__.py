"""Codes, exact Hamming search, metrics, baselines and re-ranking (numpy; torch only where noted)."""
