"""How fairseq-train updates the weights: ``radam`` (``--optimizer radam``), ``fast_update`` (the
multi-tensor update), ``precision`` (``--bf16`` as autocast mixed precision). May import only ``errors`` and ``files``."""
