"""The files the plugin reads and writes: ``checkpoints`` (loaded safely, named when missing) and
``folders`` (output folders taken back on failure). May import only ``errors``."""
