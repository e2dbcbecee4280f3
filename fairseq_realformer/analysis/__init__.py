"""Look inside a translation model: the RealFormer paper's attention analyses (Figs. 4-6).

- ``capture``: records the per-head probabilities every attention layer used;
- ``statistics``: per-token entropy and adjacent-layer Jensen-Shannon divergence, streamed;
- ``measure``: runs a model teacher-forced over batches and accumulates them per path;
- ``figures``: the paper's violin grids and a comparison of models (matplotlib);
- ``cli``: the ``realformer-analyze`` command.

Not imported by the plugin itself (``--user-dir``), so training never loads matplotlib. May import
every part of the plugin but ``patches``, which the package installs.
"""
