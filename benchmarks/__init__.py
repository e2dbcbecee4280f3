"""Speed and memory benchmarks: each prints a table beside fairseq's own Transformer and writes its
result JSON to benchmarks/results/. They may import the plugin and common/, never studies/."""
