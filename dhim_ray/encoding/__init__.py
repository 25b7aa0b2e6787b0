"""The frozen encoder, its on-disk features, and the whitening transform."""
