"""What the quality studies (studies/) and the speed benchmarks (benchmarks/) share, defined once:
the checkout's paths, variants (with fairseq's own Transformer) and where run folders go (repo),
running a command with its log, time and error line (commands), a result JSON with its header
(results), the machine's name and processor generation (host), a CPU training's allocator settings
(allocator), fairseq's log reader (fairseq_log), the models and schedules trained (presets) and the
Multi30k arguments (multi30k_args). Nothing here imports either side: it may import the plugin, the
standard library and torch alone."""
