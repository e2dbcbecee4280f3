"""What the quality studies (studies/) and the speed benchmarks (benchmarks/) share, defined once:
the checkout's paths and variants with fairseq's own Transformer (repo), the JSON header
(repo.write_result), the machine's name (host), fairseq's log reader (fairseq_log), the models
and schedules trained (presets) and the Multi30k arguments (multi30k_args). Nothing here imports
either side."""
