"""The top layer: the `hybridkv` command line, the demo, the simulator, benchmark
traces and the drivers that replay them through a manager (`replay`, `ideal`,
`digest`), and the helpers benchmarks share (`disconnects`, `tokenizer_checkpoint`)."""
