"""What the tests and the benchmarks share (as SGLang's `sglang.test` does): servers started in
subprocesses, and the simulations both judge a component by."""
