"""The field's formats in and out: KernelBench problems, FlashInfer-Trace solutions."""
