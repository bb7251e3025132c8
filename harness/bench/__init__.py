"""Measuring a serving endpoint: the benchmark client (`client`, over `sse_client`), prompt
sets (`datasets`), metrics in `sglang.bench_serving`'s names (`metrics`), greedy-output
correctness (`correctness`) and the import of `sglang.bench_serving` result files
(`importer`)."""
