"""The frozen encoder, its on-disk features, and its refinements (whitening, SG-OPT)."""
