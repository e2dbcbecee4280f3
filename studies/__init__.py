"""The translation-quality studies: Multi30k trainings of the plugin's variants, seeds and learning
rates, scored, compared and drawn. `python studies/quality.py --help` is where to start; STUDY.md
is what they found. They may import the plugin and common/, never benchmarks/.

    quality.py       the command line: a study's settings from its flags, then train and report
    study.py         a Study (the plan: its runs' settings and folders) and its StudyRecord (its Settings
                     and runs, gathered or loaded; the verdict rules: best rate, seeds, what is compared)
    runs.py          one run folder (RunFolder): what the recipe and the runner leave there, and a
                     run's record (Run), as the study's JSON holds it
    recipe.py        the Multi30k recipe's commands: the data, a run's fairseq-train flags
    supervise.py     training a study's runs N at a time: locks, niceness, the divergence watch
    status.py        each run's state while a study trains (quality.py --status), and the runner's epoch lines
    divergence.py    when a training has diverged (the one definition)
    scoring.py       comparisons: paired bootstrap, permutation test, means over seeds
    tables.py        the Markdown tables
    figures.py       the figures
    depth_report.py, depth_stability.py, dropout_gap.py, source_use.py, lr_depth_study.sh: the depth studies
    checkpoints.py   what dropout_gap.py and source_use.py share: their flags, loading, batches
"""
