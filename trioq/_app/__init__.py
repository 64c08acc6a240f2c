"""The service around a queue: the CLI, ``trioq serve``, the HTTP app, the demo, loadgen."""
