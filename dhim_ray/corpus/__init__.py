"""Reading corpora: one set of input rules for every split, file and hub dataset."""
