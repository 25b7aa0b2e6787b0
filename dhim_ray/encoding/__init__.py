"""The frozen encoder, its on-disk features, and its refinements (whitening, flow, SG-OPT)."""
