"""Training: the one loop, model selection, the target choice, and the run orchestration."""
