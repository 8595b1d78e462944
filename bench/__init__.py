"""The benchmarks: each script in this folder says what it measures; ``bench.harness``
holds how (servers, limiters, timing loops, tables). docs/benchmarks.md reads them."""
